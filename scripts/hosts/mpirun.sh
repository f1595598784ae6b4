#!/usr/bin/env bash
# An `mpirun` for `conduit-hpc run` across the test cluster's hosts:
#   CONDUIT_MPIRUN=scripts/hosts/mpirun.sh conduit-hpc run jobs/dqn_cartpole.toml
# ranks dealt round-robin over every host of the cluster (CONDUIT_HOSTS_MAP_BY=slot fills
# host0 first), or over the hosts of CONDUIT_HOSTS_HOSTFILE (e.g. 2 of 3); see docs/hosts.md.
exec "$(dirname "${BASH_SOURCE[0]}")/cluster.sh" mpirun \
  ${CONDUIT_HOSTS_HOSTFILE:+--hostfile "$CONDUIT_HOSTS_HOSTFILE"} \
  --map-by "${CONDUIT_HOSTS_MAP_BY:-node}" "$@"
