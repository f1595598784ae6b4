#!/usr/bin/env bash
# Before / after of the learner's CPU per prioritized batch (scripts/learner_cpu.py),
# interleaved: after (this checkout), then before (a worktree of the base commit), PAIRS
# times per row kind. Indicative, as learner_cpu.py says; run it with nothing else on
# the machine and write the load average beside its figures.
#
#   git worktree add --detach /tmp/base <commit>
#   scripts/ab_learner.sh /tmp/base [PAIRS] [BATCHES] [KINDS...]
#
# Each line: kind, then after's and before's learner_cpu.py figures.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: scripts/ab_learner.sh BASE_WORKTREE [PAIRS] [BATCHES] [KINDS...]}
pairs=${2:-3}
batches=${3:-2000}
shift $(( $# < 3 ? $# : 3 ))
kinds=("$@")
[ ${#kinds[@]} -gt 0 ] || kinds=(cartpole atari)
here=$PWD
py=$here/.venv/bin/python
source scripts/mpi_env.sh
echo "# $(date +%T) $(uptime | sed 's/.*load/load/')"
for _ in $(seq "$pairs"); do
  for kind in "${kinds[@]}"; do
    a=$(mpirun -n 4 "$py" -m mpi4py scripts/learner_cpu.py "$kind" "$batches" 2>&1 | grep -a "us/batch")
    b=$(cd "$base" && PYTHONPATH=$base mpirun -n 4 "$py" -m mpi4py "$here/scripts/learner_cpu.py" \
        "$kind" "$batches" 2>&1 | grep -a "us/batch")
    echo "$kind | after: ${a#*: } | before: ${b#*: }"
  done
done
echo "# $(date +%T) $(uptime | sed 's/.*load/load/')"
