"""What `conduit-hpc run` checks before mpirun: the job script's contract and -n."""

from __future__ import annotations

import pytest

from conduit_hpc.config.jobs import contract_problem, main_calls_job_main
from conduit_hpc.errors import ConfigError, WorldTooSmall


@pytest.mark.parametrize(("source", "ok"), [
    ('if __name__ == "__main__":\n    job_main(C, run)\n', True),
    ("if '__main__' == __name__:\n    conduit_hpc.job.job_main(C, run)\n", True),
    ('if __name__ == "__main__":\n    if True:\n        job_main(C, run)\n', True),
    ("job_main(C, run)\n", False),                       # not under __main__
    ('if __name__ == "__main__":\n    run(None, None, "")\n', False),
    ("def f():\n    if __name__ == '__main__':\n        job_main(C, run)\n", False),
    ("this is not python(\n", False),
])
def test_main_calls_job_main(source: str, ok: bool) -> None:
    assert main_calls_job_main(source) is ok


def test_contract_problem_names_what_to_change(tmp_path) -> None:
    main = 'from conduit_hpc.job import job_main\nif __name__ == "__main__":\n    job_main(1, 2)\n'
    good = tmp_path / "good.py"
    good.write_text("def run(cfg, run_dir, resume):\n    pass\n" + main)
    assert contract_problem(good) == ""
    assert "no job script" in contract_problem(tmp_path / "absent.py")
    no_main = tmp_path / "no_main.py"
    no_main.write_text("def run(cfg, run_dir, resume):\n    pass\n")
    assert "never calls job_main" in contract_problem(no_main)
    no_run = tmp_path / "no_run.py"
    no_run.write_text("run = 3\n" + main)
    assert "defines no run(cfg, run_dir, resume)" in contract_problem(no_run)
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n" + main)
    with pytest.raises(ConfigError, match="boom"):
        contract_problem(broken)


@pytest.mark.parametrize(("layout", "n", "error"), [
    ({"learners": 1, "buffers": 1, "actors": 4}, 6, None),
    ({"learners": 1, "buffers": 1, "actors": 4}, 5, WorldTooSmall),
    ({"learners": 1, "buffers": 1, "actors": 4}, 7, ConfigError),
    ({"learners": 1, "buffers": 1, "actors": 0}, 2, WorldTooSmall),
    ({"learners": 1, "buffers": 1, "actors": 0}, 3, None),
    ({"learners": 1, "buffers": 1, "actors": 0}, 64, None),
    ({"learners": 1, "buffers": 1, "actors": 4, "per_node": True}, 2, None),  # not checked
])
def test_ranks_problem_mirrors_the_role_assignment(layout, n, error) -> None:
    from conduit_hpc import Config
    from conduit_hpc.config import LayoutConfig
    from conduit_hpc.config.layout_rule import assign_roles
    from conduit_hpc.tools.launcher import ranks_problem

    cfg = Config(layout=LayoutConfig(**layout))
    got = ranks_problem(cfg, n)
    assert (None if got is None else type(got)) is error
    if not layout.get("per_node"):
        _, want = assign_roles(cfg.layout, (0,) * n)  # what the ranks would raise
        assert (None if want is None else type(want)) is error


def test_a_stop_request_after_the_run_does_not_kill_the_rank(tmp_path) -> None:
    """A SIGUSR1 (a preemption warning, or the launcher forwarding a SIGTERM) that
    reaches a rank after its run returned - while it finalizes - is ignored: before,
    Python's finalization gave SIGUSR1 its default action back and the rank died of it
    after finishing its work (seen: ``killed by signal 10`` at the end of a job)."""
    import subprocess
    import sys

    cfg = tmp_path / "c.toml"
    cfg.write_text("")
    code = (
        "import os, signal, sys\n"
        "from conduit_hpc.config import Config\n"
        "from conduit_hpc.job import job_main, stop_requested\n"
        "seen = []\n"
        "def run(cfg, run_dir, resume):\n"
        "    os.kill(os.getpid(), signal.SIGUSR1)\n"  # during the run: a stop request
        "    seen.append(stop_requested())\n"
        f"job_main(Config, run, ['--config', {str(cfg)!r}])\n"
        "assert seen == [True], seen\n"
        "class Late:\n"  # a signal while the interpreter tears its modules down
        "    def __del__(self):\n"
        "        os.kill(os.getpid(), signal.SIGUSR1)\n"
        "        os.write(1, b'alive')\n"
        "late = Late()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)  # (./checkpoints/.lock: see job_main)
    assert out.returncode == 0 and "alive" in out.stdout, (out.returncode,
                                                           out.stderr[-2000:])
