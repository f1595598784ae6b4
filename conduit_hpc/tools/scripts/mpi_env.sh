# source me: the environment that makes oversubscribed Open MPI (pip wheel) ranks behave.
# The one source of these values: `conduit-hpc run` (conduit_hpc.tools.launcher.mpi_env)
# reads the `export NAME=${NAME:-value}` lines below, so keep each such line in that form
# (values already set win, in the shell and in Python alike). Sourced by the launch
# scripts beside it and by the repository's scripts/mpi_env.sh (Makefile, tests).
# See docs/sharp-bits.md for why each line is here.
_conduit_pkg=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# the virtualenv: $VIRTUAL_ENV, else a checkout's .venv, else the venv this package is in
if [ -z "${VIRTUAL_ENV:-}" ]; then
  for _conduit_d in "$_conduit_pkg/../../../.venv" "$_conduit_pkg/../../../../../.."; do
    if [ -f "$_conduit_d/pyvenv.cfg" ]; then
      VIRTUAL_ENV=$(cd "$_conduit_d" && pwd)
      break
    fi
  done
fi
if [ -n "${VIRTUAL_ENV:-}" ]; then
  export VIRTUAL_ENV
  export PATH=$VIRTUAL_ENV/bin:$PATH
  export OPAL_PREFIX=${OPAL_PREFIX:-$VIRTUAL_ENV}
fi
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
export OMPI_MCA_osc=${OMPI_MCA_osc:-^ucx}
export OMPI_MCA_btl=${OMPI_MCA_btl:-^ofi}
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}
export OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1}
# wire every peer up inside MPI_Init: left lazy (the default, 0), a rank's first message
# to a peer asks the PMIx server for the peer's address with no time limit - after a link
# dropped before that first contact, a rank hung there inside a "non-blocking" Ibarrier,
# where no deadline of ours could end it (docs/hosts.md, "Faults")
export OMPI_MCA_mpi_add_procs_cutoff=${OMPI_MCA_mpi_add_procs_cutoff:-1000000}
# slot: fill each node's slots in turn (on several nodes of an allocation, the bare
# ":oversubscribe" maps by core and put every rank on the first node: docs/hosts.md)
export PRTE_MCA_rmaps_default_mapping_policy=${PRTE_MCA_rmaps_default_mapping_policy:-slot:oversubscribe}
export PRTE_MCA_hwloc_default_binding_policy=${PRTE_MCA_hwloc_default_binding_policy:-none}
if [ "$(id -u)" = 0 ]; then  # root only
  export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}
  export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
fi
unset _conduit_pkg _conduit_d
