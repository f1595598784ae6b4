#!/usr/bin/env bash
# PRRTE's "ssh" for the test cluster (PRTE_MCA_plm_ssh_agent): `agent.sh [ssh options] HOST
# COMMAND...` runs COMMAND with /bin/sh inside HOST's namespaces, as sshd would run it in
# the remote login shell. The environment passes through (a cluster's shared home would
# give the remote shell the same venv); cluster.sh mpirun sets CONDUIT_HOSTS_NAME/_DIR.
set -euo pipefail
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done  # ssh options such as -x
host=${1:?agent.sh: no host given}; shift
exec "$(dirname "${BASH_SOURCE[0]}")/cluster.sh" exec "$host" /bin/sh -c "$*"
