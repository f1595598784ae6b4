"""Every code block of the README, ``docs/*.md`` and ``slurm/README.md`` runs as written.

The blocks of one page run in order, in one fresh working directory outside the
checkout that holds a ``jobs`` link to the repository's ``jobs/`` (so relative paths
such as ``jobs/synthetic.toml`` work as from the root, and ``runs/`` lands there):

* ``python`` blocks run in a subprocess; marked ``<!-- run: mpirun -n N -->`` on the
  line above (blank lines allowed between), under ``mpirun -n N python -m mpi4py``;
* ``bash``/``sh``/``shell`` blocks run in ``bash -e`` with the repository's environment
  (``conduit-hpc`` on ``PATH``, the MPI settings of ``scripts/mpi_env.sh``);
* a block marked ``<!-- not-run: reason -->`` is not run, and the reason must be given;
* ``toml``/``json``/``text`` blocks and diagrams are data, not commands: never run (a
  block in any other language fails the test, so that none is left out unnoticed).

Nothing is skipped silently: the test fails on a python or shell block that is neither
run nor marked.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conduit_hpc.testing import REPO
from conduit_hpc.tools.launcher import mpi_env

PAGES = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")),
         "slurm/README.md"]
RUNNABLE = {"python": "python", "bash": "bash", "sh": "bash", "shell": "bash"}
DATA = {"toml", "json", "text", "diff", ""}  # shown, never run (a diagram has no language)
_FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```$", re.M | re.S)
_MARK = re.compile(r"<!--\s*(run|not-run):\s*(.*?)\s*-->\s*$", re.S)


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    code: str
    mark: str  # "", "run", "not-run"
    arg: str   # the mark's text: "mpirun -n 3", or the reason


def blocks(page: str) -> list[Block]:
    text = (REPO / page).read_text()
    out = []
    for m in _FENCE.finditer(text):
        before = text[:m.start()].rstrip("\n ").rsplit("\n", 1)[-1]
        mark = _MARK.search(before)
        indent = len(m.group(1))
        code = "\n".join(ln[indent:] for ln in m.group(3).splitlines()) + "\n"
        out.append(Block(page, text.count("\n", 0, m.start()) + 1, m.group(2), code,
                         mark.group(1) if mark else "", mark.group(2) if mark else ""))
    return out


def test_every_page_has_blocks_and_every_mark_is_well_formed() -> None:
    for page in PAGES:
        for b in blocks(page):
            assert b.lang in RUNNABLE or b.lang in DATA, (
                f"{page}:{b.line}: a ```{b.lang} block is neither run nor data; use python "
                f"or bash, or add its language to DATA here")
            if b.mark == "not-run":
                assert len(b.arg) > 10, f"{page}:{b.line}: a not-run block needs a reason"
            if b.mark == "run":
                assert b.lang == "python" and re.fullmatch(r"mpirun -n \d+", b.arg), \
                    f"{page}:{b.line}: '<!-- run: mpirun -n N -->' is for python blocks"
    assert any(b.mark == "run" for b in blocks("README.md"))


def env_for(work: Path) -> dict[str, str]:
    env = mpi_env({k: v for k, v in os.environ.items() if not k.startswith("SLURM_")})
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env["PATH"]
    env["HOME"] = env.get("HOME", str(work))
    return env


def run_block(b: Block, work: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    src = work / f"block-{b.line}.{'py' if b.lang == 'python' else 'sh'}"
    src.write_text(b.code)
    if b.lang == "python":
        cmd = [sys.executable, str(src)]
        if b.mark == "run":
            n = b.arg.split()[-1]
            cmd = ["mpirun", "-n", n, sys.executable, "-m", "mpi4py", str(src)]
    else:
        cmd = ["bash", "-e", "-o", "pipefail", str(src)]
    return subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.mark.parametrize("page", PAGES)
def test_the_pages_code_blocks_run_as_written(page: str, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "jobs").symlink_to(REPO / "jobs")
    env = env_for(work)
    ran = 0
    for b in blocks(page):
        if b.mark == "not-run" or RUNNABLE.get(b.lang) is None:
            continue
        out = run_block(b, work, env)
        assert out.returncode == 0, (
            f"{page}:{b.line} ({b.lang} block) exited {out.returncode}\n--- block:\n{b.code}"
            f"--- stdout:\n{out.stdout[-3000:]}\n--- stderr:\n{out.stderr[-3000:]}")
        ran += 1
    runnable = [b for b in blocks(page) if RUNNABLE.get(b.lang) and b.mark != "not-run"]
    assert ran == len(runnable)
