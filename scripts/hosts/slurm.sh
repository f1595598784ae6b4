#!/usr/bin/env bash
# A multi-node SLURM on the test cluster of cluster.sh (root; Debian 12 slurm 22.05): munged
# and slurmctld on host0 (the "head node", also where sbatch/squeue run), one slurmd on
# every host of the cluster. All state under $BASE; nothing in /etc or /run is touched.
#
#   slurm.sh up BASE        start the daemons; every node idle before it returns
#   slurm.sh down BASE      stop them by PID (pid files under BASE), never by name
#   slurm.sh exec BASE CMD  CMD on host0 with SLURM_CONF set (sbatch, squeue, scontrol ...)
#
# The cluster is the one of CONDUIT_HOSTS_NAME / CONDUIT_HOSTS_DIR (see cluster.sh); it must
# be up. Every host has its own network namespace, so the daemons keep SLURM's default
# ports (6817/6818) on the cluster's addresses without meeting another SLURM on the machine.
# The rest of the filesystem is shared by the hosts (BASE, the checkout, the venv), except
# the PMIx client directory: each host gets a private tmpfs there (both nodes of a step
# would otherwise make the same spmix_appdir_<uid>_<job>.<step> in one folder).
# Adapted from scripts/slurm/setup_slurm.sh (one node) and /work/shared/local-slurm.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CLUSTER=$HERE/cluster.sh
NCPU_DECL=${NCPU_DECL:-8}   # CPUs declared per node (oversubscribe a small machine)

die() { echo "slurm.sh: $*" >&2; exit 2; }
log() { echo "slurm.sh: $*" >&2; }

cmd=${1:-}; BASE=${2:-}
[ -n "$cmd" ] && [ -n "$BASE" ] || die "usage: slurm.sh up|down BASE | exec BASE CMD..."
shift 2
BASE=$(mkdir -p "$BASE" && cd "$BASE" && pwd)
CONF=$BASE/etc/slurm.conf

hosts() {
  local st
  st=$("$CLUSTER" status 2>/dev/null) || die "the test cluster is not up (cluster.sh status: $st)"
  awk '/^host[0-9]+ pid/ {print $1}' <<<"$st"
}
in_host() { local h=$1; shift; "$CLUSTER" exec "$h" "$@"; }

stop() {
  local pf pid pids=()
  # TERM to slurmd, slurmctld and munged at once, then wait for all (KILL after 5 s)
  for pf in "$BASE"/run/slurmd-*.pid "$BASE/run/slurmctld.pid" "$BASE/munge/munged.pid"; do
    [ -s "$pf" ] || continue
    pid=$(cat "$pf")
    rm -f "$pf"
    # only a daemon of ours: a pid file left by a crashed run may name a recycled PID
    case $(cat "/proc/$pid/comm" 2>/dev/null) in slurmd|slurmctld|munged) ;; *) continue ;; esac
    kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
  done
  for _ in $(seq 1 50); do
    local alive=()
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive+=("$pid"); done
    pids=("${alive[@]}")
    [ ${#pids[@]} -eq 0 ] && return 0
    sleep 0.1
  done
  log "force-killing ${pids[*]}"
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

up() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
    && command -v munged >/dev/null && command -v sbatch >/dev/null \
    || die "SLURM is not installed (slurmctld, slurmd, munged, sbatch); run .ci/install_slurm.sh"
  local all h i addrs=() names=()
  all=$(hosts)
  [ -n "$all" ] || die "the test cluster has no host up"
  stop  # a leftover of a crashed run under the same BASE
  mkdir -p "$BASE"/{etc,state,log,run,munge,pmix}
  chmod 700 "$BASE/munge"
  for h in $all; do
    i=${h#host}
    names+=("$h"); addrs+=("10.213.0.$((10 + i))")
    mkdir -p "$BASE/spool/slurmd-$h"
  done
  [ -s "$BASE/munge/munge.key" ] || dd if=/dev/urandom of="$BASE/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$BASE/munge/munge.key"
  local mem; mem=$(( $(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 / ${#names[@]} - 512 ))
  {
    cat <<CONF
ClusterName=conduithosts
SlurmctldHost=host0(10.213.0.10)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$BASE/munge/munge.socket,cred_expire=20
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool/slurmd-%n
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmdPidFile=$BASE/run/slurmd-%n.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
PlugStackConfig=$BASE/etc/plugstack.conf
KillWait=5
MailProg=/bin/true
InactiveLimit=0
MinJobAge=60
JobRequeue=1
CONF
    for i in "${!names[@]}"; do
      echo "NodeName=${names[$i]} NodeAddr=${addrs[$i]} CPUs=$NCPU_DECL Boards=1 SocketsPerBoard=1 CoresPerSocket=$NCPU_DECL ThreadsPerCore=1 RealMemory=$mem State=UNKNOWN"
    done
    echo "PartitionName=hosts Nodes=$(IFS=,; echo "${names[*]}") Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
  } >"$CONF"
  : >"$BASE/etc/plugstack.conf"
  echo "PMIxCliTmpDirBase=$BASE/pmix" >"$BASE/etc/mpi.conf"
  trap 'rc=$?; if [ $rc -ne 0 ]; then log "up failed (exit $rc); stopping what it started"; stop; fi' EXIT
  # munged on host0; its socket is a file on the shared filesystem, so every host's
  # daemons reach it (a path-bound unix socket does not belong to a network namespace)
  in_host host0 munged --force --key-file="$BASE/munge/munge.key" \
    --socket="$BASE/munge/munge.socket" --pid-file="$BASE/munge/munged.pid" \
    --log-file="$BASE/munge/munged.log" --seed-file="$BASE/munge/munged.seed"
  for _ in $(seq 1 50); do [ -S "$BASE/munge/munge.socket" ] && break; sleep 0.1; done
  munge --socket="$BASE/munge/munge.socket" -n | unmunge --socket="$BASE/munge/munge.socket" \
    | grep -q 'STATUS: *Success' || die "munged does not answer ($BASE/munge/munged.log)"
  in_host host0 env SLURM_CONF="$CONF" slurmctld -c
  for h in "${names[@]}"; do
    # a private PMIx client folder per host (a tmpfs in the host's own mount namespace)
    in_host "$h" sh -c "mountpoint -q '$BASE/pmix' || mount -t tmpfs -o size=64m pmix '$BASE/pmix'"
    in_host "$h" env SLURM_CONF="$CONF" slurmd
  done
  local idle=0
  for _ in $(seq 1 150); do
    idle=$(in_host host0 env SLURM_CONF="$CONF" sinfo -h -N -o %T 2>/dev/null \
      | grep -c -E '^(idle|mixed|allocated)' || true)
    [ "$idle" -ge ${#names[@]} ] && break
    sleep 0.2
  done
  [ "$idle" -ge ${#names[@]} ] || die "only $idle of ${#names[@]} nodes idle: \
$(in_host host0 env SLURM_CONF="$CONF" sinfo -N 2>&1 | tr '\n' ' '); see $BASE/log"
  trap - EXIT
  log "up: ${#names[@]} nodes (${names[*]}), slurmctld on host0, SLURM_CONF=$CONF"
}

case $cmd in
  up) up ;;
  down) stop ;;
  exec) [ $# -gt 0 ] || die "exec needs a command"
        exec "$CLUSTER" exec host0 env SLURM_CONF="$CONF" "$@" ;;
  *) die "usage: slurm.sh up|down BASE | exec BASE CMD..." ;;
esac
