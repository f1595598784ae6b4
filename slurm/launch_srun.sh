#!/bin/bash
# srun --mpi=pmix inside a SLURM allocation (see launch.sh):
#   slurm/launch_srun.sh JOB.toml [conduit-hpc run options]
exec "$(dirname "${BASH_SOURCE[0]}")/launch.sh" srun "$@"
