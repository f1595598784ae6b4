#!/bin/bash
# Start a one-node SLURM (Debian 12 slurm 22.05: munged, slurmctld, slurmd) with all state
# under $BASE; nothing in /etc or /run is touched. Run as root. Adapted from
# /work/shared/local-slurm/RECIPE.md (section 2). Stop it with stop_slurm.sh.
#   BASE=/tmp/x SLURMCTLD_PORT=... SLURMD_PORT=... scripts/slurm/setup_slurm.sh
# then: export SLURM_CONF=$BASE/etc/slurm.conf
set -euo pipefail
BASE=${BASE:?set BASE to a folder for SLURM state, e.g. \$PWD/.slurm}
HOST=$(hostname -s)
NCPU_DECL=${NCPU_DECL:-8}              # CPUs to declare (oversubscribe a small box)
SLURMCTLD_PORT=${SLURMCTLD_PORT:-6817}
SLURMD_PORT=${SLURMD_PORT:-6818}
REAL_MEM=$(( $(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 - 1024 ))
mkdir -p "$BASE"/{etc,state,log,run,munge} "$BASE/spool/slurmd-$HOST"
chmod 700 "$BASE/munge"

# --- munge: own key, socket, pid, log, seed ---
if [ ! -s "$BASE/munge/munge.key" ]; then
  dd if=/dev/urandom of="$BASE/munge/munge.key" bs=1024 count=1 status=none
fi
chmod 400 "$BASE/munge/munge.key"
# --force: munged refuses a socket under a directory that is not world-executable
munged --force --key-file="$BASE/munge/munge.key" --socket="$BASE/munge/munge.socket" \
       --pid-file="$BASE/munge/munged.pid" --log-file="$BASE/munge/munged.log" \
       --seed-file="$BASE/munge/munged.seed"
for _ in $(seq 1 50); do [ -S "$BASE/munge/munge.socket" ] && break; sleep 0.1; done
munge --socket="$BASE/munge/munge.socket" -n | unmunge --socket="$BASE/munge/munge.socket" \
  | grep -q 'STATUS: *Success'

cat > "$BASE/etc/slurm.conf" <<CONF
ClusterName=conduit
SlurmctldHost=$HOST(127.0.0.1)
AuthType=auth/munge
CredType=cred/munge
# cred_expire: credential lifetime, and how long a requeued job waits before it may
# start again (default 120 s). Forcing an earlier start (scontrol update StartTime=now)
# races the revoked credential of the previous attempt ("Job credential revoked").
AuthInfo=socket=$BASE/munge/munge.socket,cred_expire=20
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$SLURMCTLD_PORT
SlurmdPort=$SLURMD_PORT
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool/slurmd-%n
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmdPidFile=$BASE/run/slurmd-%n.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd.log
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
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$NCPU_DECL Boards=1 SocketsPerBoard=1 CoresPerSocket=$NCPU_DECL ThreadsPerCore=1 RealMemory=$REAL_MEM State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
: > "$BASE/etc/plugstack.conf"
# PMIx client directories under BASE: job ids restart at 1 with every fresh slurmctld,
# and a step that failed leaves /tmp/spmix_appdir_<uid>_<job>.<step> behind, which
# would make the same step id of a later instance fail to launch ("File exists").
mkdir -p "$BASE/pmix"
echo "PMIxCliTmpDirBase=$BASE/pmix" > "$BASE/etc/mpi.conf"
export SLURM_CONF=$BASE/etc/slurm.conf

slurmctld -c    # -c: start clean (no saved jobs); daemonizes, writes its pid file
slurmd          # daemonizes, writes its pid file
for _ in $(seq 1 100); do
  sinfo -h -o %T 2>/dev/null | grep -q -E '^(idle|mixed|allocated)' && break
  sleep 0.2
done
sinfo -h -o %T | grep -q -E '^(idle|mixed|allocated)' || {
  echo "setup_slurm: node did not become idle; see $BASE/log" >&2; exit 1; }
echo "setup_slurm: up (slurmctld pid $(cat "$BASE/run/slurmctld.pid"), slurmd pid" \
     "$(cat "$BASE/run/slurmd-$HOST.pid"), ports $SLURMCTLD_PORT/$SLURMD_PORT)"
