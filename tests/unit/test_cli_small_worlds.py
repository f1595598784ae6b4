"""``probe`` and ``info`` refuse a world their layout cannot take before anything is
launched: one ``conduit-hpc: error`` line, exit status 2 (before: ``probe -n 1`` printed
a WorldTooSmall traceback from the ranks and the MPI_ABORT banner, rc 1)."""

from __future__ import annotations

import time

import pytest

from conduit_hpc.tools import cli


@pytest.mark.parametrize("argv", [["probe", "-n", "1"], ["probe", "-n", "1", "--learners", "0"]])
def test_probe_refuses_one_rank_before_launching(argv: list[str], capsys) -> None:
    t0 = time.monotonic()
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err == ("conduit-hpc: error: ConfigError: -n must be at least 2 for the "
                            "probe (a buffer rank and an actor rank, besides any "
                            "learners), got 1\n")
    assert captured.out == "" and time.monotonic() - t0 < 5  # nothing was launched


def test_info_refuses_one_rank_without_a_config(capsys, monkeypatch) -> None:
    monkeypatch.delenv("OMPI_COMM_WORLD_SIZE", raising=False)
    monkeypatch.delenv("PMI_SIZE", raising=False)
    assert cli.main(["info", "-n", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("conduit-hpc: error: ConfigError: -n must be 0 (the default: 2 "
                          "ranks) or at least 2 without --config") and err.endswith("got 1\n")
