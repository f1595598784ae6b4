"""Every benchmark's numeric, name-list and path options are checked while its arguments
are parsed (``conduit_hpc/bench/_args.py``): a bad value is one ``error: argument --NAME``
line naming the value, exit status 2, before anything runs (before: ``bench frames
--batches -1`` and ``bench tiers --rows -1`` ended in tracebacks, ``bench adaptive
--interval 0`` in ``range() arg 3 must not be zero``, ``--live-timeout-s nan`` in
``cannot convert float NaN``, ``bench scale --measured-learners /nonexist`` in
``FileNotFoundError``, and ``bench capacity --actors 1000000`` would have started a
million ranks). The parsers are taken from the benchmarks' own ``main``, so
an option added later with a bare ``int`` or ``float`` fails here."""

from __future__ import annotations

import argparse
import importlib
import math
import os
import subprocess
from pathlib import Path

import pytest

from conduit_hpc.bench._args import (
    Checked,
    Names,
    existing_dir,
    finished_run,
    link,
    names,
    out_dir,
    out_file,
    real,
    run_dir,
    torch_device,
    wholes,
)
from conduit_hpc.tools import cli

BENCHES = sorted(cli.benchmarks())


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def parser_of(name: str, monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """The benchmark's parser, taken at its ``parse_args`` (nothing runs)."""
    mod = importlib.import_module(f"conduit_hpc.bench.{name.replace('-', '_')}")

    def capture(self: argparse.ArgumentParser, *a: object, **k: object) -> None:
        raise _Parsed(self)

    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_args", capture)
        with pytest.raises(_Parsed) as got:
            mod.main([])
    return got.value.parser


def options(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if a.option_strings and a.nargs is None
            and not isinstance(a, argparse._HelpAction)]


def refuses(p: argparse.ArgumentParser, opt: str, value: str,
            capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as ex:
        p.parse_args([f"{opt}={value}"])
    err = capsys.readouterr().err
    assert ex.value.code == 2, (opt, value, err)
    assert f"argument {opt}: must be" in err, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("name", BENCHES)
def test_no_benchmark_takes_an_unchecked_number(name: str, monkeypatch) -> None:
    p = parser_of(name, monkeypatch)
    bare = [a.option_strings[0] for a in options(p) if a.type in (int, float)]
    assert bare == [], f"bench {name}: {bare} take a bare int/float (use bench/_args.py)"


@pytest.mark.parametrize("name", BENCHES)
def test_every_numeric_option_refuses_what_is_out_of_range_and_takes_its_bounds(
        name: str, monkeypatch, capsys) -> None:
    p = parser_of(name, monkeypatch)
    checked = [a for a in options(p) if isinstance(a.type, Checked)]
    for a in checked:
        c, opt = a.type, a.option_strings[0]
        assert isinstance(c, Checked)
        below = (c.lo if c.open_lo else c.lo - 1) if c.integer else (
            c.lo if c.open_lo else c.lo - max(1.0, abs(c.lo)))
        above = c.hi + 1 if c.integer else c.hi * 2 + 1
        bad = ["nan", "inf", "-inf", "1e400", "x", "", " ", "1e30", "0x10",
               repr(int(below)) if c.integer else repr(below),
               repr(int(above)) if c.integer else repr(above)]
        if c.integer:
            bad += ["1.5", "2e3"]
        if c.many:
            bad += [",", "1,,1", f"{int(c.hi) if c.integer else c.hi},"]
        for v in bad:
            err = refuses(p, opt, v, capsys)
            assert repr(v) in err, (opt, v, err)
        # the bounds themselves are taken (and a list of them)
        lo = c.lo if not c.open_lo else (c.lo + 1 if c.integer else math.nextafter(c.lo, c.hi))
        for v in (lo, c.hi):
            text = str(int(v)) if c.integer else repr(v)
            if c.many:  # both bounds in one list
                text = ", ".join(str(int(x)) if c.integer else repr(x) for x in (lo, c.hi))
            ns = p.parse_args([f"{opt}={text}"])
            got = getattr(ns, a.dest)
            if c.many:
                assert [float(x) for x in got.split(",")] == [float(lo), float(c.hi)]
            else:
                assert got == (int(v) if c.integer else v)
        if c.many:  # a value twice: the same run or size twice, a skewed summary
            one = str(int(c.hi)) if c.integer else repr(c.hi)
            err = refuses(p, opt, f"{one},{one}", capsys)
            assert "distinct" in err and "twice" in err, err
        # the default parses (a string default goes through the type too)
        assert p.parse_args([]) is not None


@pytest.mark.parametrize("name", BENCHES)
def test_every_list_of_names_refuses_unknown_empty_and_repeated_names(
        name: str, monkeypatch, capsys) -> None:
    p = parser_of(name, monkeypatch)
    for a in options(p):
        if not isinstance(a.type, Names):
            continue
        opt, allowed = a.option_strings[0], a.type.allowed
        for v in ("foo", "", ",", f"{allowed[0]},{allowed[0]}", f"{allowed[0]},",
                  f"{allowed[0]},foo"):
            with pytest.raises(SystemExit):
                p.parse_args([f"{opt}={v}"])
            err = capsys.readouterr().err
            assert f"argument {opt}: must be a comma-separated list of" in err, err
            assert repr(v) in err
        for one in allowed:
            assert getattr(p.parse_args([f"{opt}= {one} "]), a.dest) == one


PATH_TYPES = (existing_dir, out_dir, out_file, run_dir, finished_run)


def bad_paths(kind: object, tmp: Path) -> list[str]:
    """Paths each kind of path option must refuse (``tmp`` holds a file and a folder)."""
    # (not "unwritable" folders: root may write where others may not, and the suite
    # runs as root in CI)
    a_file, a_dir = tmp / "a-file", tmp / "a-dir"
    if kind is existing_dir:
        return [str(a_file), str(tmp / "missing"), str(a_file / "x")]
    if kind is out_dir:
        return [str(a_file), str(a_file / "under-a-file"), str(a_file / "a" / "b")]
    if kind is out_file:
        return [str(a_dir), str(tmp / "missing" / "x.json"), str(a_file / "x.json")]
    return [str(a_dir), str(a_file), str(tmp / "missing")]  # run_dir, finished_run


@pytest.mark.parametrize("name", BENCHES)
def test_every_path_option_refuses_what_it_cannot_use(name: str, monkeypatch, capsys,
                                                      tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-dir").mkdir()
    p = parser_of(name, monkeypatch)
    for a in p._actions:
        if a.type not in PATH_TYPES or not a.option_strings:
            continue
        opt = a.option_strings[0]
        for v in bad_paths(a.type, tmp_path):
            with pytest.raises(SystemExit):
                p.parse_args([f"{opt}={v}"])
            err = capsys.readouterr().err
            assert f"argument {opt}: must be" in err and repr(v) in err, (opt, v, err)
        before = sorted(os.listdir(tmp_path))
        good = {existing_dir: tmp_path / "a-dir", out_dir: tmp_path / "new" / "runs",
                out_file: tmp_path / "out.json"}.get(a.type)
        if good is not None:  # what it can use is taken, and nothing is made meanwhile
            assert getattr(p.parse_args([f"{opt}={good}"]), a.dest) in (str(good), [str(good)])
            assert sorted(os.listdir(tmp_path)) == before


def test_a_run_directory_has_learner_metrics_and_a_finished_one_a_summary(
        tmp_path: Path) -> None:
    (tmp_path / "metrics").mkdir()
    for check in (run_dir, finished_run):
        with pytest.raises(argparse.ArgumentTypeError, match=r"metrics/learner-\*\.csv"):
            check(str(tmp_path))
    (tmp_path / "metrics" / "learner-0.csv").write_text("superstep\n")
    assert run_dir(str(tmp_path)) == str(tmp_path)
    with pytest.raises(argparse.ArgumentTypeError, match=r"metrics/summary\.json"):
        finished_run(str(tmp_path))
    (tmp_path / "metrics" / "summary.json").write_text("{}")
    assert finished_run(str(tmp_path)) == str(tmp_path)


def test_a_link_is_probe_or_a_latency_and_a_bandwidth() -> None:
    assert link(" probe ") == "probe"
    assert link("25, 1.5") == "25.0,1.5"
    assert link("0,1e6") == "0.0,1000000.0"
    for bad in ("", "probe,1", "25", "25,1.5,3", "-1,1", "25,0", "25,nan", "inf,1",
                "25,1e7", "a,b"):
        with pytest.raises(argparse.ArgumentTypeError, match=repr(bad)):
            link(bad)


def test_checked_types_say_what_they_want() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"of a, b; got 'a,c' \(unknown: c\)"):
        names(("a", "b"))("a,c")
    assert names(("a", "b"))("b, a") == "b,a"
    for bad in ("foo", "cuda:99", "meta", ""):
        with pytest.raises(argparse.ArgumentTypeError, match=repr(bad)):
            torch_device(bad)
    assert torch_device("cpu") == "cpu"
    with pytest.raises(argparse.ArgumentTypeError, match=r"integers from 1 to 8, got '1,9'"):
        wholes(1, 8)("1,9")
    with pytest.raises(argparse.ArgumentTypeError, match=r"number above 0 to 1, got '0'"):
        real(0, 1, open_lo=True)("0")
    assert wholes(1, 8)(" 1, 2 ") == "1,2"
    assert real(0, 1)("1") == 1.0


@pytest.mark.parametrize("argv", [
    ["bench", "frames", "--batches", "-1"],
    ["bench", "tiers", "--rows", "-1"],
    ["bench", "adaptive", "--interval", "0"],
    ["bench", "adaptive", "--live-timeout-s", "nan"],
    ["bench", "capacity", "--actors", "1000000"],
    ["bench", "exposed-latency", "--cases", "foo"],
    ["bench", "exposed-latency", "--modes", "foo"],
    ["bench", "ingest", "--transports", "foo"],
    ["bench", "ingest", "--kinds", "foo"],
    ["bench", "tiers", "--device", "foo"],
    ["bench", "allreduce", "--backend", "foo"],
    ["bench", "scale", "--measured-learners", "/no/such/run"],
    ["bench", "frames", "--checkpoint", "--dir", "/no/such/dir"],
    ["bench", "frames", "--checkpoint", "--codec", "zip"],
    ["bench", "frames", "--capacity", "8"],  # a batch of 4 rows failed mid-run
    ["bench", "frames", "--streams", "65536"],  # 1.2 TB of episodes: MemoryError, or OOM
    ["bench", "scale", "--link", "5,-1"],
    ["bench", "longhaul", "--budgets", "1e-12"],  # below the link's floor once made bytes/s
])
def test_the_cli_refuses_them_before_anything_runs(argv: list[str], capsys,
                                                   monkeypatch) -> None:
    flag = argv[-2]  # each case ends in the flag and its bad value

    def launch(*a: object, **k: object) -> None:
        raise AssertionError(f"{argv} launched {a[:1]}")

    monkeypatch.setattr(subprocess, "run", launch)  # nothing may start
    monkeypatch.setattr(subprocess, "Popen", launch)
    with pytest.raises(SystemExit) as ex:
        cli.main(argv)
    assert ex.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: " in err and repr(argv[-1]) in err, err
    assert "Traceback" not in err


def test_bench_frames_refuses_batches_past_free_memory(capsys, monkeypatch) -> None:
    """``bench frames --batches 1048576`` gathered 118 GB: a numpy MemoryError."""
    monkeypatch.setattr("conduit_hpc.plane.memory.free_memory_bytes", lambda: 4 << 30)
    with pytest.raises(SystemExit) as ex:
        cli.main(["bench", "frames", "--smoke", "--batches", "1048576"])
    err = capsys.readouterr().err
    assert ex.value.code == 2 and "argument --batches: must leave the run within" in err, err
    assert "'1048576'" in err


@pytest.mark.parametrize("argv", [
    ["bench", "capacity", "--modes", "edp,edp"],
    ["bench", "capacity", "--modes", "sync,sync:direct"],
    ["bench", "capacity", "--modes", "edp,"],
    ["bench", "capacity", "--kinds", "cartpole,cartpole"],
    ["bench", "capacity", "--kinds", "cartpole,,atari"],
    ["bench", "peers", "--modes", "sync,sync"],
    ["bench", "peers", "--kinds", "atari,atari"],
    ["bench", "peers", "--samplers", "uniform,uniform"],
    ["bench", "convergence", "--modes", "sync,sync"],
    ["bench", "convergence", "--modes", "sync,"],
    ["bench", "convergence", "--seeds", "0,0"],
    ["bench", "torchrl", "--modes", "foo"],
    ["bench", "rllib", "--seeds", "1,1"],
    ["bench", "ingest", "--batches", "64,64"],
    ["bench", "hosts-placement", "--plans", "aware,aware"],
    ["bench", "hosts-placement", "--plans", "blind,aware"],
    ["bench", "hosts-placement", "--rates", "1gbit,,100mbit"],
])
def test_a_list_naming_an_item_twice_or_none_is_refused_before_anything_runs(
        argv: list[str], capsys, monkeypatch) -> None:
    """Lists parsed after argparse took an item twice and ran it twice (``bench capacity
    --modes edp,edp``: two runs of each kind, both rows in the table and the summary;
    ``convergence --seeds 0,0``: the same seed twice in the median), or dropped an empty
    item; ``convergence``, ``torchrl`` and ``hosts-placement`` ended a bad one with exit
    status 1 and no ``error:`` line. Now exit 2 naming the flag and the value."""

    def launch(*a: object, **k: object) -> None:
        raise AssertionError(f"{argv} launched {a[:1]}")

    monkeypatch.setattr(subprocess, "run", launch)  # nothing may start
    monkeypatch.setattr(subprocess, "Popen", launch)
    with pytest.raises(SystemExit) as ex:
        cli.main(argv)
    assert ex.value.code == 2
    err = capsys.readouterr().err
    assert f"error: argument {argv[-2]}: " in err or f"error: {argv[-2]} must" in err, err
    assert repr(argv[-1]) in err and "Traceback" not in err, err


def test_a_bad_set_of_bench_torchrl_is_one_error_before_any_run(tmp_path: Path, capsys,
                                                                 monkeypatch) -> None:
    """``bench torchrl --set nosuch.key=1`` started every run, each failing on it."""
    from conduit_hpc.bench import torchrl

    def launch(*a: object, **k: object) -> None:
        raise AssertionError(f"ran {a[:1]}")

    monkeypatch.setattr(torchrl, "run_mode", launch)  # no run may start
    out = tmp_path / "out"
    assert cli.main(["bench", "torchrl", "--set", "nosuch.key=1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'nosuch' in the top level" in err, err
    assert not out.exists()
