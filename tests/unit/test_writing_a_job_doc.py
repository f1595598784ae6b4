"""docs/writing-a-job.md shows the example job's files as they are in the repository."""

from __future__ import annotations

import re

import pytest

from conduit_hpc.testing import REPO

DOC = REPO / "docs" / "writing-a-job.md"
# "`jobs/NAME.ext`:" on its own line, a blank line, (a "<!-- not-run: ... -->" line for
# tests/launch/test_readme.py,) then the fenced block
_SHOWN = re.compile(r"^`(jobs/[\w.]+)`:\n\n(?:<!--[^\n]*-->\n)?```\w*\n(.*?)^```$",
                    re.M | re.S)


def shown_files() -> dict[str, str]:
    return {m.group(1): m.group(2) for m in _SHOWN.finditer(DOC.read_text())}


def test_the_doc_shows_both_files_of_the_example_job() -> None:
    assert set(shown_files()) == {"jobs/example_gym.py", "jobs/example_gym.toml"}


@pytest.mark.parametrize("name", ["jobs/example_gym.py", "jobs/example_gym.toml"])
def test_the_doc_code_block_is_the_file(name: str) -> None:
    assert shown_files()[name] == (REPO / name).read_text(), (
        f"{name} and its block in docs/writing-a-job.md differ: edit both")


def test_the_example_loads_with_its_job_section() -> None:
    from conduit_hpc import Config

    cfg = Config.from_toml(REPO / "jobs" / "example_gym.toml", ["example.batches=7"])
    assert cfg.example.batches == 7  # type: ignore[attr-defined]
    assert cfg.scheduler.sampler == "uniform"
    assert cfg.spec["reward"].cast == "same_kind"
