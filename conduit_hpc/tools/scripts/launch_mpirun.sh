#!/bin/bash
# plain mpirun inside a SLURM allocation (see launch.sh):
#   bash launch_mpirun.sh JOB.toml [conduit-hpc run options]
exec bash "$(dirname "${BASH_SOURCE[0]}")/launch.sh" mpirun "$@"
