# source me: the environment that makes oversubscribed Open MPI (pip wheel) ranks behave.
# Used by the Makefile's test targets; `conduit-hpc run` sets the same defaults itself.
# See ../docs/sharp-bits.md for why each line is here.
_here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export VIRTUAL_ENV=${VIRTUAL_ENV:-$_here/.venv}
export PATH=$VIRTUAL_ENV/bin:$PATH
export OPAL_PREFIX=${OPAL_PREFIX:-$VIRTUAL_ENV}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
export OMPI_MCA_osc=${OMPI_MCA_osc:-^ucx}
export OMPI_MCA_btl=${OMPI_MCA_btl:-^ofi}
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}
export OMPI_MCA_mpi_yield_when_idle=1
export PRTE_MCA_rmaps_default_mapping_policy=${PRTE_MCA_rmaps_default_mapping_policy:-:oversubscribe}
export PRTE_MCA_hwloc_default_binding_policy=${PRTE_MCA_hwloc_default_binding_policy:-none}
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
unset _here
