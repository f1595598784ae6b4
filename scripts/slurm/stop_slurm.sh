#!/bin/bash
# Stop the daemons that setup_slurm.sh started under $BASE, by PID (from their pid files):
# TERM, then KILL after 5 s. Never by name: other SLURMs on the machine are left alone.
BASE=${BASE:?set BASE to the folder given to setup_slurm.sh}
HOST=$(hostname -s)
for pf in "$BASE/run/slurmd-$HOST.pid" "$BASE/run/slurmctld.pid" "$BASE/munge/munged.pid"; do
  [ -s "$pf" ] || continue
  pid=$(cat "$pf")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then echo "force-killing $pid"; kill -KILL "$pid"; fi
    echo "stopped $(basename "$pf" .pid) pid $pid"
  fi
  rm -f "$pf"
done
