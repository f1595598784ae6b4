"""The scale model against runs on this machine (``conduit-hpc bench scale --measured``
and ``--measured-learners``).

* ``--measured RUN_DIR ...``: per data-plane mode, the model's iteration and exposed
  latency beside the exposed-latency benchmark's runs (:func:`load_measured`,
  :func:`predict_local`, :func:`compare_with_measured`).
* ``--measured-learners RUN_DIR ...``: per learner count, the DQN job's runs with 1, 2,
  ... data-parallel learners (``bench convergence --learners``): the model's
  per-superstep time - the run's own local compute, plus the predicted exposed
  experience path, plus the ring all-reduce of the gradient and of the one-integer
  agreement (:func:`~conduit_hpc.bench.allreduce.ring_allreduce_s`) - beside what the
  runs measured (:func:`load_learner_runs`, :func:`predict_learners`,
  :func:`compare_learners`). The learners' all-reduce here is gloo over TCP loopback,
  not the cluster file's shared-memory link, so the all-reduce terms use a link given
  or probed here (:func:`fit_link`, :func:`probe_gloo_link`).

Not collective; the probe starts its own ``mpirun``.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from typing import Any

from conduit_hpc.bench._scale_model import MODES, predict_modes
from conduit_hpc.bench.allreduce import ring_allreduce_s
from conduit_hpc.plane.sampled_rows import row_weight, rows_after

__all__ = ["compare_learners", "compare_with_measured", "fit_link", "load_learner_runs",
           "load_measured", "predict_learners", "predict_local", "probe_gloo_link"]

#: bytes of the learners' per-superstep agreement (one int64, ``LearnerGroup.agree``)
AGREE_BYTES = 8.0


# ---------------------------------------------------------------------------------
# data-plane modes (the exposed-latency benchmark's runs)


def load_measured(run_dirs: list[str]) -> dict[str, dict[str, float]]:
    """Mean iteration_s, exposed_s and compute_s per mode from runs' learner CSVs
    (``RUN_DIR/metrics/learner-<rank>.csv``, columns of the scheduler's metrics), skipping
    the first 10 % of supersteps as warm-up; means over supersteps (a row weighs those
    it stands for, its ``weight``)."""
    acc: dict[str, list[dict[str, str]]] = {}
    for d in run_dirs:
        for f in sorted(Path(d, "metrics").glob("learner-*.csv")):
            for r in _rows(f):
                acc.setdefault(r["mode"], []).append(r)
    return {mode: {k: _mean(rows, k) for k in ("iteration_s", "exposed_s", "compute_s")}
            for mode, rows in acc.items()}


def compare_with_measured(predicted: dict[str, dict[str, float]],
                          measured: dict[str, dict[str, float]]) -> list[dict]:
    """PREDICTED VS MEASURED. Print the model's iteration and exposed latency per mode
    beside what runs on this machine measured, with their ratios; returns the rows.

    ``predicted``: mode -> {"iteration_s", "exposed_s"} from :func:`predict_modes` on
    ``jobs/cluster-local.toml`` with the runs' workload and measured compute time;
    ``measured``: mode -> the same keys, e.g. from :func:`load_measured`.
    """
    rows = []
    print(f"\n{'mode':>8} {'iter pred ms':>13} {'iter meas ms':>13} {'ratio':>6} "
          f"{'exp pred ms':>12} {'exp meas ms':>12} {'ratio':>6}")
    for mode in MODES:
        if mode not in predicted or mode not in measured:
            continue
        p, m = predicted[mode], measured[mode]
        row = {"mode": mode, "iteration_pred_s": p["iteration_s"],
               "iteration_meas_s": m["iteration_s"], "exposed_pred_s": p["exposed_s"],
               "exposed_meas_s": m["exposed_s"]}
        ri, re_ = _ratio(p["iteration_s"], m["iteration_s"]), _ratio(p["exposed_s"],
                                                                        m["exposed_s"])
        print(f"{mode:>8} {p['iteration_s'] * 1e3:>13.3f} {m['iteration_s'] * 1e3:>13.3f} "
              f"{ri:>6.2f} {p['exposed_s'] * 1e3:>12.3f} {m['exposed_s'] * 1e3:>12.3f} "
              f"{re_:>6.2f}")
        rows.append(row)
    return rows


def predict_local(job_toml: Path, measured: dict[str, dict[str, float]],
                  costs: dict[str, float], cluster_path: Path) -> dict[str, dict]:
    """The model's numbers for a job config run on this machine (``cluster-local.toml``),
    at the compute time the runs measured."""
    from conduit_hpc.placement.cluster import ClusterModel
    from conduit_hpc.placement.workload import Workload

    w, _ = Workload.from_toml(job_toml)
    comp = statistics.mean(m.get("compute_s", 0.0) for m in measured.values()) if measured \
        else 0.0
    if comp > 0:
        w = replace(w, compute_s=comp)
    return predict_modes(ClusterModel.from_toml(cluster_path), w, costs)


# ---------------------------------------------------------------------------------
# several learners (the DQN job's runs with layout.learners = 1, 2, ...)


def fit_link(agree_s: float, large_s: float, large_bytes: float, ranks: int = 2) -> Any:
    """The link (latency, bandwidth) under which :func:`ring_allreduce_s` gives the two
    measured all-reduce times of ``ranks`` ranks: ``agree_s`` for one 8-byte integer
    (latency-bound: ``2 (p-1)`` latencies) and ``large_s`` for ``large_bytes``.

    Raises:
        ValueError: times that are not positive, or a large all-reduce no slower than
            its latency part (no bandwidth can be fitted).
    """
    from conduit_hpc.placement.clusterfile import LinkSpec

    if not (ranks >= 2 and agree_s > 0 and large_s > 0 and large_bytes > AGREE_BYTES):
        raise ValueError(f"fit_link: needs ranks >= 2, positive times and large_bytes > "
                         f"{AGREE_BYTES:g}; got ranks={ranks}, agree_s={agree_s!r}, "
                         f"large_s={large_s!r}, large_bytes={large_bytes!r}")
    steps = 2 * (ranks - 1)
    latency = agree_s / steps
    per_step = large_s / steps - latency
    if per_step <= 0:
        raise ValueError(f"fit_link: the all-reduce of {large_bytes:,.0f} bytes "
                         f"({large_s * 1e6:.1f} us) is no slower than {steps} latencies of "
                         f"the 1-integer one ({agree_s * 1e6:.1f} us): no bandwidth to fit")
    return LinkSpec(bandwidth_gbps=large_bytes / ranks / per_step / 1e9, latency_s=latency)


def probe_gloo_link(floats: int = 1_000_000, iterations: int = 30) -> tuple[Any, str]:
    """Measure the learners' link here: ``bench allreduce`` at 2 ranks (the job's
    ``torch.distributed`` group, gloo on CPU), fitted with :func:`fit_link` to its
    1-integer ``agree`` and its ``allreduce_mean_`` of ``floats`` float32. Returns the
    link and a line saying where it came from."""
    from conduit_hpc.bench import allreduce

    res = allreduce.main(["--ranks", "2", "--floats", str(floats), "--iterations",
                          str(iterations)])["results"]
    by = {r["op"]: r for r in res}
    link = fit_link(by["agree"]["median_us"] * 1e-6,
                    by["allreduce_mean_"]["median_us"] * 1e-6, 4.0 * floats)
    return link, (f"{by['agree']['backend']} probed here (bench allreduce, 2 ranks, median "
                  f"of {iterations}: agree {by['agree']['median_us']:.0f} us, "
                  f"{floats:,} floats {by['allreduce_mean_']['median_us']:.0f} us)")


def load_learner_runs(run_dirs: list[str]) -> dict[int, dict[str, Any]]:
    """Per learner count, the means over the DQN runs in ``run_dirs`` (each
    ``metrics/summary.json`` and the lead learner's ``metrics/learner-<rank>.csv``, first
    10 % of supersteps dropped): ``iteration_s``, ``exposed_s``, ``compute_s`` (the time
    between batches: the update, the gradient all-reduce and the agreement included),
    ``allreduce_s`` and ``agree_s`` (the lead learner's mean per call, waiting for the
    other learners included; 0 with one learner), ``local_compute_s`` (compute without
    the two), ``updates_per_s``, ``ingest_rows_per_s``; and ``runs``, ``config`` (the
    first run's ``config.toml``).

    Raises:
        FileNotFoundError: a run directory without its summary or learner metrics.
        ValueError: a run with several learners whose summary has no collective times.
    """
    acc: dict[int, list[dict[str, Any]]] = {}
    for d in run_dirs:
        metrics = Path(d, "metrics")
        summary = json.loads((metrics / "summary.json").read_text())
        csvs = sorted(metrics.glob("learner-*.csv"), key=lambda f: int(f.stem.split("-")[1]))
        if not csvs:
            raise FileNotFoundError(f"{metrics}: no learner-<rank>.csv")
        rows = _rows(csvs[0])  # the lead learner: the lowest rank
        n = int(summary.get("learners", 1))
        run: dict[str, Any] = {k: _mean(rows, k) for k in ("iteration_s", "exposed_s",
                                                           "compute_s")}
        if n > 1 and not all(k in summary for k in ("allreduce_mean_s", "agree_mean_s")):
            raise ValueError(f"{metrics / 'summary.json'}: a run with {n} learners without "
                             "allreduce_mean_s / agree_mean_s (runs of the DQN job record "
                             "them from git 188bbd9 on; run it again)")
        run["allreduce_s"] = _num(summary.get("allreduce_mean_s")) if n > 1 else 0.0
        run["agree_s"] = _num(summary.get("agree_mean_s")) if n > 1 else 0.0
        run["updates_per_s"] = float(summary.get("updates_per_s", 0.0))
        run["ingest_rows_per_s"] = float(summary.get("ingest_rows_per_s", 0.0))
        run["config"] = str(Path(d, "config.toml"))
        acc.setdefault(n, []).append(run)
    out: dict[int, dict[str, Any]] = {}
    for n, runs in sorted(acc.items()):
        m: dict[str, Any] = {k: statistics.mean(r[k] for r in runs)
                             for k in runs[0] if k != "config"}
        m["local_compute_s"] = max(m["compute_s"] - m["allreduce_s"] - m["agree_s"], 0.0)
        m.update(runs=len(runs), config=runs[0]["config"])
        out[n] = m
    return out


def predict_learners(measured: dict[int, dict[str, Any]], costs: dict[str, float],
                     cluster_path: Path, link: Any, gradient_bytes: float
                     ) -> dict[int, dict[str, float]]:
    """Per learner count, the model's per-superstep time for the runs' job (their
    ``config.toml``: batch, rows, mode, actors) on ``cluster_path``'s node with that many
    learners: the runs' own ``local_compute_s`` (an input, not a prediction), the
    predicted exposed experience path (shared memory, the cluster file's link), and the
    ring all-reduce of ``gradient_bytes`` and of the 8-byte agreement over ``link``."""
    from conduit_hpc.placement.cluster import ClusterModel
    from conduit_hpc.placement.workload import Workload

    template = ClusterModel.from_toml(cluster_path)
    out: dict[int, dict[str, float]] = {}
    for n, m in measured.items():
        cfg = run_config(m["config"])
        actors = max(cfg.layout.actors, 1)
        node = {**template.to_dict()["nodes"][0], "learners": n, "buffers": 1,
                "actors": actors}
        cluster = ClusterModel.from_dict({"name": f"local-{n}L", "nodes": [node]})
        w, _ = Workload.from_job(cfg)
        w = replace(w, compute_s=max(m["local_compute_s"], 1e-9),
                    update_rate_hz=max(m["updates_per_s"], 1e-3),
                    actor_rows_per_s=m["ingest_rows_per_s"] / actors)
        mode = cfg.scheduler.mode if cfg.scheduler.mode in MODES else "edp"
        p = predict_modes(cluster, w, costs, gradient_bytes, ar_link=link)[mode]
        agree = ring_allreduce_s(AGREE_BYTES, n, link.bandwidth_gbps, link.latency_s)
        out[n] = {"compute_s": m["local_compute_s"], "exposed_s": p["exposed_s"],
                  "allreduce_s": p["allreduce_s"], "agree_s": agree,
                  "iteration_s": p["iteration_s"] + agree}
    return out


def compare_learners(predicted: dict[int, dict[str, float]],
                     measured: dict[int, dict[str, Any]], link_note: str = "") -> list[dict]:
    """PREDICTED VS MEASURED per learner count: exposed path, gradient all-reduce,
    agreement and per-superstep iteration, with ratios predicted / measured, and each
    count's iteration relative to one learner's (the scaling the model claims against
    the scaling measured). Prints a table; returns the rows.

    ``predicted``: count -> {"compute_s", "exposed_s", "allreduce_s", "agree_s",
    "iteration_s"} (:func:`predict_learners`); ``measured``: count -> the same keys plus
    ``runs`` (:func:`load_learner_runs`).
    """
    keys = ("exposed_s", "allreduce_s", "agree_s", "iteration_s")
    counts = sorted(set(predicted) & set(measured))
    base = counts[0] if counts else 1
    if link_note:
        print(f"\nall-reduce link: {link_note}")
    print(f"\n{'learners':>8} {'runs':>4} {'compute ms':>10} "
          + " ".join(f"{k[:-2] + ' p/m ms':>20} {'ratio':>5}" for k in keys)
          + f" {'iter/1L p':>9} {'iter/1L m':>9}")
    rows = []
    for n in counts:
        p, m = predicted[n], measured[n]
        row: dict[str, Any] = {"learners": n, "runs": m.get("runs", 1),
                               "compute_s": p["compute_s"]}
        cells = []
        for k in keys:
            row[f"{k[:-2]}_pred_s"], row[f"{k[:-2]}_meas_s"] = p[k], m[k]
            row[f"{k[:-2]}_ratio"] = _ratio(p[k], m[k])
            cells.append(f"{p[k] * 1e3:>9.3f}/{m[k] * 1e3:<10.3f} "
                         f"{row[f'{k[:-2]}_ratio']:>5.2f}")
        row["scaling_pred"] = _ratio(p["iteration_s"], predicted[base]["iteration_s"])
        row["scaling_meas"] = _ratio(m["iteration_s"], measured[base]["iteration_s"])
        print(f"{n:>8} {row['runs']:>4} {p['compute_s'] * 1e3:>10.3f} " + " ".join(cells)
              + f" {row['scaling_pred']:>9.2f} {row['scaling_meas']:>9.2f}")
        rows.append(row)
    return rows


def measured_learners(run_dirs: list[str], costs: dict[str, float], cluster_path: Path,
                      link_arg: str, gradient_bytes: float) -> list[dict]:
    """``bench scale --measured-learners``: load, predict, compare. ``link_arg``:
    ``probe`` or ``LATENCY_US,GBPS``; ``gradient_bytes`` 0: the runs' Q network's."""
    measured = load_learner_runs(run_dirs)
    if link_arg == "probe":
        link, note = probe_gloo_link()
    else:
        from conduit_hpc.placement.clusterfile import LinkSpec

        try:
            lat_us, gbps = (float(x) for x in link_arg.split(","))
        except ValueError:
            raise SystemExit(f"--link: 'probe' or LATENCY_US,GBPS, got {link_arg!r}") from None
        link, note = LinkSpec(bandwidth_gbps=gbps, latency_s=lat_us * 1e-6), "given (--link)"
    note = (f"{note}: latency {link.latency_s * 1e6:.1f} us, {link.bandwidth_gbps:.3g} GB/s "
            f"(the cluster file's shm link is not the learners' TCP-loopback gloo group)")
    if gradient_bytes <= 0:
        gradient_bytes = q_network_bytes(next(iter(measured.values()))["config"])
    print(f"gradient: {gradient_bytes:,.0f} bytes per superstep")
    return compare_learners(predict_learners(measured, costs, cluster_path, link,
                                             gradient_bytes), measured, note)


def q_network_bytes(config_toml: str) -> float:
    """float32 bytes of the DQN job's Q network (its gradient), from a run's config."""
    import gymnasium as gym

    from conduit_hpc.rl import QNetwork

    hp = run_config(config_toml).dqn
    env = gym.make(hp.env_id)
    obs = math.prod(env.observation_space.shape or (1,))
    net = QNetwork(obs, int(env.action_space.n), hp.hidden, hp.dueling)  # type: ignore[attr-defined]
    env.close()
    return 4.0 * sum(p.numel() for p in net.parameters())


def run_config(config_toml: str) -> Any:
    """A DQN run's ``config.toml`` (its ``[dqn]`` and ``[job]`` tables included), read
    with the config class ``jobs/dqn_cartpole.py`` declares."""
    from conduit_hpc.bench.common import repo_path
    from conduit_hpc.config import Config
    from conduit_hpc.config.loader import load

    return load(Config, config_toml, script=repo_path("jobs/dqn_cartpole.py"))


# ---------------------------------------------------------------------------------


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    return rows_after(rows, int(sum(map(row_weight, rows))) // 10)  # by supersteps


def _mean(rows: list[dict[str, str]], key: str) -> float:
    """The mean of ``key`` over the supersteps (a row weighs the supersteps it stands
    for), exact as :func:`statistics.mean` is: its value for rows of weight 1.

    Raises:
        statistics.StatisticsError: no row.
    """
    if not rows:
        raise statistics.StatisticsError(f"mean of {key} over no superstep")
    weights = [row_weight(r) for r in rows]
    total = sum(Fraction(float(r[key])) * Fraction(w) for r, w in zip(rows, weights,
                                                                       strict=True))
    return float(total / sum(Fraction(w) for w in weights))


def _num(x: Any) -> float:
    return float(x) if x is not None and math.isfinite(float(x)) else 0.0


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")
