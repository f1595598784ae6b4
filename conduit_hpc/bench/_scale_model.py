"""The scale model's prediction for one cluster and workload, per data-plane mode
(``bench scale``'s model; its per-operation costs come from
:func:`conduit_hpc.bench.scale.measure_costs`). Not collective; no MPI.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

__all__ = ["MODES", "allreduce_link", "cluster_of", "predict_modes", "read_split"]

MODES = ("edp", "sync", "service")


def cluster_of(template: Any, nodes: int, actors_per_learner: int) -> Any:
    """A homogeneous cluster of ``nodes`` copies of ``template``'s first node."""
    from conduit_hpc.placement.cluster import ClusterModel

    node = template.to_dict()["nodes"][0]
    node = {**node, "name": "node", "count": nodes,
            "actors": actors_per_learner * node["learners"], "buffers": max(node["buffers"], 1)}
    if nodes > 1 and "nic" not in node:
        raise ValueError("the template node has no nic; a multi-node model needs one")
    return ClusterModel.from_dict({"name": f"{template.name}-{nodes}n", "nodes": [node]})


def read_split(plan: Any, batch_rows: int) -> tuple[float, float]:
    """For the first learner (all learners are alike here): the share of its samples
    from host-memory shards on its own node (gathered with numpy on its CPU; rows in GPU
    memory are gathered on the device, their copies are in the link model), and the RMA
    reads per superstep - the distinct shards on other nodes that ``batch_rows`` samples
    hit, each read with one indexed get whose bytes the link model carries."""
    if not plan.learner_shards or plan.prediction is None:
        return 0.0, 0.0
    rank = min(plan.learner_shards)
    node = plan.prediction.learners[0].node
    local = remote = 0.0
    shares = []
    for sid in plan.learner_shards[rank]:
        sh = plan.shards[sid]
        if sh.location.startswith(node + "."):
            if sh.tier != "learner_gpu":  # GPU-resident rows are gathered on the device
                local += sh.share
        else:
            remote += sh.share
            shares.append(sh.share)
    msgs = float(np.sum(1.0 - (1.0 - np.asarray(shares)) ** batch_rows)) if shares else 0.0
    return local, msgs


def allreduce_link(cluster: Any) -> Any:
    """The link a ring all-reduce over every learner is paced by: the adapters across
    nodes, NVLink within a GPU node, shared memory otherwise."""
    node = cluster.nodes[0]
    if len(cluster.nodes) > 1 and node.nic is not None:
        return node.nic
    return node.nvlink if node.gpus and node.nvlink is not None else node.shm


def predict_modes(cluster: Any, workload: Any, costs: dict[str, float],
                  gradient_bytes: float = 0.0, *, ar_link: Any = None) -> dict[str, dict]:
    """Per mode: path_s, exposed_s, iteration_s (the slowest learner gates a BSP step),
    and allreduce_s: the learners' gradient all-reduce of ``gradient_bytes`` (a ring over
    every learner on ``ar_link``, default :func:`allreduce_link`; see ``bench
    allreduce``), which follows compute and adds to the iteration in every mode."""
    from conduit_hpc.bench.allreduce import ring_allreduce_s
    from conduit_hpc.placement.static import plan_static

    b, rb = workload.batch_rows, workload.row_bytes
    compute = workload.effective_compute_s
    gather_row = costs["gather_s_per_row"] + costs["gather_s_per_byte"] * rb
    cpu_gather = b * gather_row  # a buffer rank gathering a whole batch (service)
    cpu_sample = b * costs["sample_s_per_row"]
    cpu_update = b * costs["update_s_per_row"]
    fields = 1  # one indexed get per field and shard; the row types here have one field
    out: dict[str, dict] = {}
    # edp and sync run on the planned placement
    plan = plan_static(cluster, workload)
    pred = plan.prediction
    assert pred is not None
    link = pred.max_path_s
    local, messages = read_split(plan, b)
    path = (link + cpu_sample + local * b * gather_row + cpu_update
            + messages * costs["rma_message_s"] * fields)
    exposed = max(0.0, path - compute) + costs["handoff_s"]
    common = {"link_s": link, "bottleneck": pred.bottleneck.link,
              "planning_s": pred.planning_s, "rma_messages": messages,
              "local_share": local}
    out["edp"] = {"path_s": path, "exposed_s": exposed, "iteration_s": compute + exposed,
                  **common}
    out["sync"] = {"path_s": path, "exposed_s": path, "iteration_s": compute + path,
                   **common}
    # service: a replay server on the buffer ranks, every learner asks one of them
    svc_w = replace(workload, tiers=("buffer_host",), scope="global")
    svc = plan_static(cluster, svc_w).prediction
    assert svc is not None
    learners = sum(n.learners for n in cluster.nodes)
    buffers = max(sum(n.buffers for n in cluster.nodes), 1)
    per_buffer = -(-learners // buffers)
    serve = costs["request_s"] + cpu_sample + cpu_gather + cpu_update
    node = cluster.nodes[0]
    hop = node.nic.latency_s if (node.nic is not None and len(cluster.nodes) > 1) else \
        node.shm.latency_s
    rtt = 2 * hop + costs["request_s"]
    spath = rtt + per_buffer * serve + svc.max_path_s
    out["service"] = {"path_s": spath, "exposed_s": spath, "iteration_s": compute + spath,
                      "link_s": svc.max_path_s, "bottleneck": svc.bottleneck.link,
                      "planning_s": svc.planning_s, "learners_per_buffer": per_buffer}
    ar_link = ar_link if ar_link is not None else allreduce_link(cluster)
    ar = (ring_allreduce_s(gradient_bytes, learners, ar_link.bandwidth_gbps,
                           ar_link.latency_s) if gradient_bytes > 0 else 0.0)
    for r in out.values():
        r["allreduce_s"] = ar
        r["iteration_s"] += ar
    return out
