#!/bin/bash
# Start a conduit_hpc job inside a SLURM allocation (from an sbatch script or salloc):
#   bash launch.sh srun|mpirun JOB.toml [conduit-hpc run options ...]
# (packaged with conduit_hpc in conduit_hpc/tools/scripts/; `conduit-hpc slurm` renders
# sbatch scripts that call it by its installed path)
# - sets the environment of the Open MPI wheel (mpi_env.sh beside this: yield when idle, ...),
#   unless CONDUIT_MPI=site: a site's own MPI, set up by its modules, gets none of it
#   (CONDUIT_MPIRUN and CONDUIT_SRUN_MPI then name its mpirun / srun --mpi plugin);
# - runs `conduit-hpc run JOB.toml --launcher srun|mpirun ...` (srun --mpi=pmix, or plain
#   mpirun inside the allocation), which keeps per-rank logs in the run directory;
# - a preemption warning (SIGTERM to this shell, from `#SBATCH --signal=B:TERM@<secs>`)
#   is forwarded: the ranks get SIGUSR1, checkpoint at their next safe point and end;
#   then, when CONDUIT_REQUEUE=1 (the default) and the job was submitted with --requeue,
#   the job is requeued, and its next attempt (SLURM_RESTART_COUNT > 0) passes --resume.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
launcher=${1:?usage: launch.sh srun|mpirun JOB.toml [conduit-hpc run options]}
shift
case "$launcher" in srun|mpirun) ;; *) echo "launch.sh: launcher must be srun or mpirun, got '$launcher'" >&2; exit 2;; esac
case "${CONDUIT_MPI:-wheel}" in
  wheel)
    # shellcheck source=mpi_env.sh
    source "$here/mpi_env.sh";;
  site) ;;
  *) echo "launch.sh: CONDUIT_MPI must be wheel or site, got '$CONDUIT_MPI'" >&2; exit 2;;
esac
export PYTHONUNBUFFERED=1

extra=()
if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then
  extra+=(--resume)
fi
echo "conduit-hpc: job ${SLURM_JOB_ID:-?} attempt $(( ${SLURM_RESTART_COUNT:-0} + 1 ))" \
     "on ${SLURM_JOB_NODELIST:-?} (${SLURM_NTASKS:-?} tasks), launcher $launcher," \
     "MPI ${CONDUIT_MPI:-wheel}${extra[*]:+, resuming}"

cli=conduit-hpc  # the venv's, else the one on PATH
if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/conduit-hpc" ]; then
  cli=$VIRTUAL_ENV/bin/conduit-hpc
fi
warned=0
"$cli" run "$@" --launcher "$launcher" "${extra[@]}" &
child=$!
on_warning() {
  warned=1
  echo "conduit-hpc: preemption warning (SIGTERM); asking the job to checkpoint and stop"
  kill -TERM "$child" 2>/dev/null
}
trap on_warning TERM
rc=0
while :; do
  wait "$child"
  rc=$?
  # wait returns early (status > 128) when a trapped signal arrives; wait again
  kill -0 "$child" 2>/dev/null || break
done
trap - TERM
echo "conduit-hpc: job finished with status $rc"
if [ "$warned" = 1 ] && [ "${CONDUIT_REQUEUE:-1}" = 1 ] && [ -n "${SLURM_JOB_ID:-}" ]; then
  echo "conduit-hpc: requeueing job $SLURM_JOB_ID (the next attempt resumes)"
  scontrol requeue "$SLURM_JOB_ID" && exit 0
  echo "conduit-hpc: scontrol requeue failed" >&2
fi
exit "$rc"
