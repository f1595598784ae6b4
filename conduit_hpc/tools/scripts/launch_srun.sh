#!/bin/bash
# srun --mpi=pmix inside a SLURM allocation (see launch.sh):
#   bash launch_srun.sh JOB.toml [conduit-hpc run options]
exec bash "$(dirname "${BASH_SOURCE[0]}")/launch.sh" srun "$@"
