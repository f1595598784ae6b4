# source me: the MPI environment of the Makefile's test targets. The values live in one
# place, the packaged conduit_hpc/tools/scripts/mpi_env.sh (also read by `conduit-hpc run`);
# this only points it at the checkout's .venv unless $VIRTUAL_ENV is set.
_here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export VIRTUAL_ENV=${VIRTUAL_ENV:-$_here/.venv}
# shellcheck source=../conduit_hpc/tools/scripts/mpi_env.sh
source "$_here/conduit_hpc/tools/scripts/mpi_env.sh"
unset _here
