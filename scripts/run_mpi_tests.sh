#!/usr/bin/env bash
# Run tests/mpi under mpirun at each rank count given (default: 2 3 4 6); a test that
# needs more ranks declares @pytest.mark.mpi(min_size=N) and pytest-mpi skips it below N.
# `python -m mpi4py` aborts the whole job when a rank fails, and `timeout` bounds it.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/mpi_env.sh
PER_RUN_TIMEOUT=${PER_RUN_TIMEOUT:-600}
sizes=("$@"); [ ${#sizes[@]} -eq 0 ] && sizes=(2 3 4 6)
status=0
for n in "${sizes[@]}"; do
  echo "=== tests/mpi with $n ranks"
  log=$(mktemp)
  # a test past its timeout must end the job, not just fail on some ranks (the others would
  # wait in a collective forever): the thread method dumps stacks and exits the process
  timeout -k 10 "$PER_RUN_TIMEOUT" mpirun -n "$n" python -m mpi4py -m pytest -q --with-mpi \
      -p no:cacheprovider --color=no -o timeout_method=thread --timeout=180 \
      ${PYTEST_ARGS:-} tests/mpi >"$log" 2>&1
  rc=$?
  # every rank prints a summary: show rank 0's (the first), and all failures
  grep -aE "passed|failed|error" "$log" | sort | uniq -c
  if [ $rc -ne 0 ]; then
    echo "--- mpirun -n $n exited with $rc; log follows"
    cat "$log"
    status=1
  fi
  rm -f "$log"
done
exit $status
