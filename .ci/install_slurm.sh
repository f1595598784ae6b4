#!/usr/bin/env bash
# Install the Debian packages of a one-node SLURM for the launch tests (root, Debian 12):
# slurmctld, slurmd, slurm-client, munge, libpmix2, plus the libpmix.so link that SLURM's
# mpi/pmix plugin dlopen()s (only libpmix-dev ships it). Idempotent: does nothing when
# everything is already there. Starts no daemon (tests/launch/test_slurm.py does, with
# its state under a temporary directory, and stops them again).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
PMIX_DIR=/usr/lib/x86_64-linux-gnu/pmix2/lib

have_all() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null &&
    command -v sbatch >/dev/null && command -v munged >/dev/null &&
    [ -e "$PMIX_DIR/libpmix.so.2" ]
}

if ! have_all; then
  if [ "$(id -u)" != 0 ]; then
    echo "install_slurm: need root to apt-get install SLURM" >&2
    exit 1
  fi
  # Without systemd, the packages' postinst would try to start the Debian services with
  # a non-existent /etc/slurm/slurm.conf: deny service starts during the install.
  RM_POLICY=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    RM_POLICY=1
  fi
  trap 'if [ $RM_POLICY = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi' EXIT
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends slurmctld slurmd slurm-client munge \
    libpmix2 >/dev/null
fi
if [ -e "$PMIX_DIR/libpmix.so.2" ] && [ ! -e "$PMIX_DIR/libpmix.so" ]; then
  ln -sf libpmix.so.2 "$PMIX_DIR/libpmix.so"
fi
echo "install_slurm: slurm $(dpkg-query -W -f='${Version}' slurm-client 2>/dev/null || echo '?')," \
  "munge $(dpkg-query -W -f='${Version}' munge 2>/dev/null || echo '?'), PMIx in $PMIX_DIR"
