"""The progress board: share of the budget, rate and ETA per role; plain periodic lines
in a log (one write per block), live lines with rich on a terminal."""

from __future__ import annotations

import io
import re
import time

import pytest

from conduit_hpc.plane.progress import ProgressBoard, format_eta


class Writes(io.StringIO):
    """A log file that records each write call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, s: str) -> int:
        self.calls.append(s)
        return super().write(s)


def test_plain_lines_give_share_rate_and_eta_in_one_write_per_block() -> None:
    out = Writes()
    board = ProgressBoard(out, every_s=3600.0, live=False)
    drawn = []
    board.update("learner", 0, total=1000, unit="supersteps",
                 note=lambda: drawn.append(1) or "exposed 0.01 ms")
    board.lines["learner"].started -= 10.0  # ten seconds ago
    board.lines["learner"]._recent[:] = [(board.lines["learner"]._recent[0][0] - 10.0, 0.0)]
    board.update("actors", 2500, total=10_000, unit="env steps", time_s=100.0)
    calls = len(out.calls)
    for s in range(1, 250):  # not time yet: nothing drawn, the note not computed
        board.update("learner", s)
    assert len(out.calls) == calls and len(drawn) == 1
    board.update("learner", 250, force=True)
    block = out.calls[-1]
    lines = block.splitlines()
    assert len(lines) == 2 and all(ln.startswith("[progress ") for ln in lines)
    assert re.search(r"learner\s+25\.0%  250/1,000 supersteps  25 supersteps/s  "
                     r"ETA 30 s", lines[0]), lines[0]
    assert lines[0].endswith("exposed 0.01 ms") and len(drawn) == 2
    # the actors' line: 25% of the steps, but the time budget ends it first
    assert re.search(r"actors\s+25\.0%  2,500/10,000 env steps", lines[1]), lines[1]
    board.close()
    board.update("learner", 300, force=True)  # closed: nothing more
    assert "300/1,000" not in out.getvalue()


def test_time_budget_sets_the_share_when_it_is_ahead() -> None:
    out = io.StringIO()
    board = ProgressBoard(out, live=False)
    board.update("learner", 10, total=1000, time_s=40.0)
    line = board.lines["learner"]
    line.started = time.monotonic() - 30.0
    line._recent[:] = [(line.started, 0.0)]  # 10 in 30 s: the count would need 49 min
    board.update("learner", 10, force=True)
    assert re.search(r"learner\s+75\.\d%", out.getvalue().splitlines()[-1])
    assert "ETA 10 s" in out.getvalue().splitlines()[-1]


def test_live_board_draws_with_rich_and_logs_above_it() -> None:
    out = io.StringIO()
    board = ProgressBoard(out, live=True)
    board.update("learner", 5, total=10, unit="supersteps")
    board.log("checkpoint 1 written")
    board.update("learner", 10, force=True)
    board.close()
    text = out.getvalue()
    assert "checkpoint 1 written" in text
    assert "100.0%  10/10 supersteps" in text


@pytest.mark.parametrize(("s", "text"), [(45.2, "45 s"), (200, "3 min 20 s"),
                                         (3720, "1 h 02 min"), (float("inf"), "-")])
def test_eta_format(s: float, text: str) -> None:
    assert format_eta(s) == text


def test_one_eta_from_whichever_end_comes_first_with_its_reason() -> None:
    """Issue 23 item 7: the learner's line said ``ETA 10 min`` (its time budget) while
    the actors would reach their env-step budget in 2 min; the board shows one ETA."""
    out = io.StringIO()
    board = ProgressBoard(out, every_s=3600.0, live=False)
    board.update("learner", 0, unit="supersteps", time_s=600.0)
    board.update("actors", 0, total=12_000, unit="env steps", time_s=600.0)
    actors = board.lines["actors"]
    actors._recent[:] = [(time.monotonic() - 10.0, 0.0)]
    board.update("actors", 1000, force=True)  # 100 steps/s: 110 s to the 12,000
    learner, actor = out.getvalue().splitlines()[-2:]
    assert re.search(r"ETA 1 min 5\d s \(actors: env steps budget\)", learner), learner
    assert "ETA" not in actor and "10 min" not in learner
    board.lines["actors"].total = 10_000_000  # now the time budget comes first
    board.update("actors", 1000, force=True)
    assert re.search(r"ETA (9 min|10 min).*\(learner: time budget\)",
                     out.getvalue().splitlines()[-2])
