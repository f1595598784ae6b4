"""The measuring scripts `bench/README.md` tells readers to run ("Round 10", "Round 11"), run as
written at small sizes: they print the figures the page quotes, in every mode they take
(the benchmark tier; every subprocess has a timeout). Figures are not checked against
any speed: only that they are there and make sense."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from conduit_hpc.testing import REPO


def run(cmd: list[str], timeout: float, *, ok: bool = True
        ) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                         check=False, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert (out.returncode == 0) == ok, out.stdout + out.stderr
    return out


@pytest.mark.parametrize(("mode", "ranks"), [("sync", 4), ("edp", 4), ("edp-process", 5)])
def test_learner_cpu_prints_its_figures_in_every_mode(mode: str, ranks: int) -> None:
    out = run(["mpirun", "-n", str(ranks), sys.executable, "-m", "mpi4py",
               "scripts/learner_cpu.py", "cartpole", "40", mode], timeout=240).stdout
    got = re.search(r"cartpole: learner CPU us/batch idle (\d+) \(wall (\d+)\), inserting "
                    r"(\d+) \(wall (\d+)\); learner's share of a core while inserting "
                    r"([\d.]+)", out)
    assert got, out
    assert all(int(x) > 0 for x in got.groups()[:4])
    threads = re.findall(rf"cartpole {mode}: thread \d+: ([\d.]+) of a core, ([\d.]+) "
                         r"voluntary context switches a batch", out)
    if mode == "sync":
        assert threads == [], out
    else:  # the learner's own thread at least (edp: and the data-plane thread)
        assert len(threads) >= (2 if mode == "edp" else 1), out
        assert all(float(c) >= 0 and float(v) >= 0 for c, v in threads)


@pytest.mark.parametrize(("script", "argv", "says"), [
    ("learner_cpu.py", ["cartpole", "10", "bogus"],
     "MODE must be sync, edp or edp-process, got 'bogus'"),
    ("learner_cpu.py", ["pong"], "KIND must be cartpole or atari, got 'pong'"),
    ("learner_cpu.py", ["cartpole", "ten"], "BATCHES must be a whole number >= 1, got 'ten'"),
    ("learner_cpu.py", ["cartpole", "0"], "BATCHES must be a whole number >= 1, got '0'"),
    ("thread_handoff.py", ["-5"], "ITEMS must be a whole number >= 1, got '-5'"),
    ("longhaul_atari.py", [], "usage: longhaul_atari.py none|zlib [SECONDS]; got ''"),
    ("longhaul_atari.py", ["lz4"], "usage: longhaul_atari.py none|zlib [SECONDS]; got 'lz4'"),
    ("longhaul_atari.py", ["zlib", "nan"],
     "SECONDS must be a number of seconds above 0 and below 1e6, got 'nan'"),
    ("longhaul_atari.py", ["zlib", "soon"],
     "SECONDS must be a number of seconds above 0 and below 1e6, got 'soon'"),
    ("learner_cpu.py", ["cartpole", "\u00b2"], "BATCHES must be a whole number >= 1, got '\u00b2'"),
    ("device_learner_step.py", ["0"], "STEPS must be a whole number >= 1, got '0'"),
    ("device_learner_step.py", ["many"], "STEPS must be a whole number >= 1, got 'many'"),
])
def test_measuring_scripts_refuse_bad_arguments(script: str, argv: list[str], says: str
                                                ) -> None:
    out = run([sys.executable, f"scripts/{script}", *argv], timeout=120, ok=False)
    assert says in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_thread_handoff_prints_its_figures() -> None:
    out = run([sys.executable, "scripts/thread_handoff.py", "200"], timeout=120).stdout
    for label in ("wake round trip, threads", "wake round trip, processes"):
        assert re.search(rf"{label}\s+cpu\s+[\d.]+\s+wall\s+[\d.]+ us", out), out
    for label in ("consumer under the GIL", "consumer releases it"):
        assert re.search(rf"{label}\s+one thread: cpu\s+[\d.]+ wall\s+[\d.]+ us \| two "
                         r"threads: cpu\s+[\d.]+ wall\s+[\d.]+ us", out), out


@pytest.mark.parametrize("where", ["shared", "heap"])
def test_kernel_floor_prints_ours_and_cpprb(where: str) -> None:
    out = run([sys.executable, "scripts/kernel_floor.py", "cartpole", "20", "2", where],
              timeout=240).stdout
    ours = re.search(rf"cartpole ours \(kernels only, {where} columns\): (\d+) us a batch "
                     r"\(median of 2 rounds of 20; (\d+)-(\d+)\)", out)
    assert ours and int(ours[1]) > 0 and int(ours[2]) <= int(ours[1]) <= int(ours[3]), out
    pytest.importorskip("cpprb")
    assert re.search(r"cartpole cpprb: \d+ us a batch \(median of 2 rounds of 20", out), out


@pytest.mark.parametrize("argv", [["pong"], ["cartpole", "0"], ["cartpole", "x"],
                                  ["cartpole", "10", "1", "disk"],
                                  ["cartpole", "10", "1", "heap", "extra"]])
def test_kernel_floor_refuses_bad_arguments(argv: list[str]) -> None:
    out = run([sys.executable, "scripts/kernel_floor.py", *argv], timeout=120, ok=False)
    assert "usage: kernel_floor.py" in out.stderr and repr(" ".join(argv)) in out.stderr


def test_device_learner_step_prints_each_phase_per_device() -> None:
    # the device check's learner step (bench/README.md, "Results: the first GPU run"):
    # here only the CPU line (no GPU in CI)
    out = run([sys.executable, "scripts/device_learner_step.py", "5"], timeout=240).stdout
    cpu = json.loads(out.splitlines()[0])
    assert cpu["device"] == "cpu" and cpu["steps"] == 5 and cpu["batch"] == 64, out
    for k in ("update_ms", "to_device_ms", "forward_backward_ms", "clip_ms",
              "adam_step_ms", "weights_to_host_ms"):
        assert cpu[k] > 0, (k, out)
