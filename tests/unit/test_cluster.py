"""The cluster model: TOML loading (strict errors), examples, measurements, links."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from conduit_hpc.errors import ConfigError
from conduit_hpc.placement.cluster import ClusterModel, LinkTable, Roster, parse_bytes
from conduit_hpc.testing import REPO

NODE = """
[[nodes]]
name = "n"
count = 2
gpus = 2
buffers = 1
actors = 3
learner_gpu_bytes = "1 GB"
learner_host_bytes = 2000000000
buffer_host_bytes = "1.5GiB"
gpu_host = { bandwidth_gbps = 20.0, latency_s = 1e-5 }
shm = { bandwidth_gbps = 50.0 }
nic = { bandwidth_gbps = 10.0, latency_s = 2e-6 }
"""


def load(tmp_path: Path, text: str) -> ClusterModel:
    p = tmp_path / "cluster.toml"
    p.write_text(text)
    return ClusterModel.from_toml(p)


@pytest.mark.parametrize("name", ["cluster-local", "cluster-dgx-h100", "cluster-128x8"])
def test_example_files_load(name: str) -> None:
    c = ClusterModel.from_toml(REPO / "jobs" / f"{name}.toml")
    assert c.nodes and all(n.shm.bandwidth_gbps > 0 for n in c.nodes)
    if name == "cluster-128x8":
        assert (len(c.nodes), c.learners, c.buffers) == (128, 1024, 128)
        assert len({n.name for n in c.nodes}) == 128
    if name == "cluster-local":
        assert (c.learners, c.buffers, c.actors, c.gpus) == (1, 1, 4, 0)


def test_nodes_expand_and_bytes_parse(tmp_path: Path) -> None:
    c = load(tmp_path, 'name = "x"\n' + NODE)
    assert [n.name for n in c.nodes] == ["n0", "n1"]
    n = c.nodes[0]
    assert (n.learners, n.learner_gpu_bytes, n.learner_host_bytes) == (2, 10**9, 2 * 10**9)
    assert n.buffer_host_bytes == int(1.5 * 2**30)
    assert n.nvlink is None and n.shm.latency_s == 0.0
    assert c.tier_capacity() == {"learner_gpu": 4 * 10**9, "learner_host": 4 * 10**9,
                                 "buffer_host": 2 * int(1.5 * 2**30)}


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        (NODE.replace("actors = 3", "actors = 3\ncolour = 'red'"),
         ["unknown key 'nodes[0].colour'", "known keys"]),
        ('name = "x"\nflavour = 1\n' + NODE, ["unknown key 'flavour'"]),
        (NODE.replace('buffer_host_bytes = "1.5GiB"', "buffer_host_bytes = -5"),
         ["nodes[0].buffer_host_bytes must be >= 0 bytes, got -5"]),
        (NODE.replace('learner_gpu_bytes = "1 GB"', 'learner_gpu_bytes = "-1 GB"'),
         ["nodes[0].learner_gpu_bytes must be >= 0 bytes"]),
        (NODE.replace('learner_gpu_bytes = "1 GB"', 'learner_gpu_bytes = "1 parsec"'),
         ["nodes[0].learner_gpu_bytes", "'1 parsec'", "units"]),
        (NODE.replace("bandwidth_gbps = 50.0", "bandwidth_gbps = 0.0"),
         ["nodes[0].shm.bandwidth_gbps must be a finite number > 0"]),
        (NODE.replace("latency_s = 2e-6", "latency_s = -1.0"),
         ["nodes[0].nic.latency_s must be a finite number >= 0"]),
        (NODE.replace("gpus = 2", "gpus = 2\nlearners = 3"),
         ["nodes[0].learners must be <= gpus (2)"]),
        (NODE.replace("count = 2", "count = 0"),
         ["nodes[0].count must be between 1 and 2048 (the nodes a plan", "got 0"]),
        (NODE.replace('nic = { bandwidth_gbps = 10.0, latency_s = 2e-6 }', ""),
         ["nodes[0].nic", "several nodes"]),
        (NODE.replace("gpu_host = { bandwidth_gbps = 20.0, latency_s = 1e-5 }", ""),
         ["nodes[0].gpu_host", "node with GPUs"]),
        (NODE + '\n[[links]]\nbetween = ["n0", "cloud9"]\nbandwidth_gbps = 1.0\n',
         ["links[0].between[1] names node 'cloud9'", "not defined in [[nodes]]",
          "nodes: n0, n1"]),
        (NODE + '\n[[links]]\nbetween = ["n0", "n0"]\nbandwidth_gbps = 1.0\n',
         ["links[0].between must be two different node names"]),
        (NODE + NODE.replace("count = 2", "count = 1").replace('name = "n"', 'name = "n1"'),
         ["node name 'n1' is defined twice"]),
        ("", ["nodes must be at least one [[nodes]] entry"]),
        ("nodes = [", ["is not valid TOML"]),
    ],
)
def test_bad_cluster_files_are_named(tmp_path: Path, text: str, fragments: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    msg = str(info.value)
    assert "cluster.toml" in msg
    for f in fragments:
        assert f in msg, msg


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        ClusterModel.from_toml(tmp_path / "nope.toml")


def test_parse_bytes() -> None:
    assert parse_bytes("16 GB", "k") == 16 * 10**9
    assert parse_bytes("512MiB", "k") == 512 * 2**20
    assert parse_bytes(1e3, "k") == 1000
    for bad in ("-1", "1 GBB", "lots", True, float("nan"), -3):
        with pytest.raises(ConfigError, match="k"):
            parse_bytes(bad, "k")  # type: ignore[arg-type]


def test_link_table_numbers_every_directed_link(tmp_path: Path) -> None:
    c = load(tmp_path, NODE + '\n[[links]]\nbetween = ["n0", "n1"]\nbandwidth_gbps = 1.0\n')
    lt = LinkTable(c)
    # per node: shm, nic out/in; per GPU: h2d, d2h (no NVLink); the path both ways
    assert len(lt) == 2 * 3 + 4 * 2 + 2
    assert lt.names[lt.path[(0, 1)]] == "n0->n1" and lt.names[lt.path[(1, 0)]] == "n1->n0"
    assert (lt.nvl_out == -1).all() and lt.bytes_per_s[lt.shm[0]] == 50e9
    assert lt.names[lt.h2d[3]] == "n1.gpu1.h2d"


def test_roster_block_and_from_ranks(tmp_path: Path) -> None:
    c = load(tmp_path, NODE)
    r = Roster.block(c)
    assert r.learners == ((0, 1), (6, 7)) and r.buffers == ((2,), (8,))
    assert r.actors == ((3, 4, 5), (9, 10, 11))
    r2 = Roster.from_ranks(c, [0] * 6 + [1] * 6, [0, 1, 6, 7], [2, 8], [3, 4, 5, 9, 10, 11])
    assert r2 == r
    with pytest.raises(ConfigError, match="3 learners but has 2 GPUs"):
        Roster.from_ranks(c, [0] * 12, [0, 1, 2], [3], [4])
    with pytest.raises(ConfigError, match="runs on 3 nodes"):
        Roster.from_ranks(c, [0, 1, 2], [0], [1], [2])


def test_from_measurements_and_bandwidth_overrides() -> None:
    c = ClusterModel.from_measurements(nodes=2, gpus_per_node=0, learners_per_node=1,
                                       buffers_per_node=1, actors_per_node=2, shm_gbps=8.0,
                                       shm_latency_s=1e-6, nic_gbps=1.0, nic_latency_s=1e-5,
                                       host_bytes=16 * 10**9)
    assert c.source == "probe" and len(c.nodes) == 2 and c.nodes[0].nic is not None
    assert c.nodes[0].learner_host_bytes + c.nodes[0].buffer_host_bytes == 4 * 10**9
    with pytest.raises(ConfigError, match="nic_gbps"):
        ClusterModel.from_measurements(nodes=2, gpus_per_node=0, learners_per_node=1,
                                       buffers_per_node=1, actors_per_node=1, shm_gbps=8.0,
                                       shm_latency_s=0.0, host_bytes=10**9)
    slow = c.with_bandwidth({"nic": 0.5, "node1.shm": 2.0})
    assert [n.nic.bandwidth_gbps for n in slow.nodes if n.nic] == [0.5, 0.5]
    assert [n.shm.bandwidth_gbps for n in slow.nodes] == [8.0, 2.0]
    with pytest.raises(ConfigError, match="link kind"):
        c.with_bandwidth({"warp": 1.0})
    with pytest.raises(ConfigError, match="no node named"):
        c.with_bandwidth({"node9.nic": 1.0})
    # round trip through the file shape
    assert ClusterModel.from_dict(c.to_dict(), source="probe") == c


@pytest.mark.parametrize("line,fragment", [
    ("learners = 100000000", "learners must be between 0 and 4096"),
    ("count = 1000000000", "count must be between 1 and 2048"),
    ("actors = 4096\ncount = 1000", "at most 1048576 ranks"),
])
def test_cluster_sizes_are_bounded_before_anything_is_allocated(tmp_path, line: str,
                                                                fragment: str) -> None:
    text = (REPO / "jobs" / "cluster-local.toml").read_text()
    key = line.split(" = ")[0]
    text = "\n".join(ln for ln in text.splitlines() if not ln.startswith(key + " ="))
    text = text.replace("[[nodes]]\n", f"[[nodes]]\n{line}\n", 1)
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=fragment):
        ClusterModel.from_toml(f)


NODE_KEYS = ("count", "gpus", "learners", "buffers", "actors", "learner_gpu_bytes",
             "learner_host_bytes", "buffer_host_bytes", "shm", "nic", "gpu_host", "name",
             "bogus")


def _fuzz_value():
    from hypothesis import strategies as st

    scalar = st.one_of(st.booleans(), st.integers(-2**40, 2**66), st.text(max_size=8),
                       st.floats(allow_nan=True, allow_infinity=True))
    return st.one_of(scalar, st.lists(scalar, max_size=3),
                     st.dictionaries(st.sampled_from(["bandwidth_gbps", "latency_s", "x"]),
                                     scalar, max_size=3))


def test_cluster_files_fuzzed_load_or_name_the_key(tmp_path) -> None:
    """Random values for random keys of a cluster file: a model, or a ConfigError naming
    the file - never another exception or a runaway allocation."""
    import tomli_w
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    import conduit_hpc.config as cc

    base = cc.read_toml(REPO / "jobs" / "cluster-local.toml")

    @settings(deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.lists(st.tuples(st.sampled_from(NODE_KEYS), _fuzz_value()), min_size=1,
                    max_size=3))
    def check(pairs) -> None:
        doc = {"name": base["name"], "nodes": [dict(base["nodes"][0])]}
        for k, v in pairs:
            doc["nodes"][0][k] = v
        try:
            text = tomli_w.dumps(doc)
        except (TypeError, ValueError):
            return  # not expressible as TOML (e.g. NaN in some writers)
        f = tmp_path / "fuzz.toml"
        f.write_text(text)
        try:
            ClusterModel.from_toml(f)
        except ConfigError as err:
            assert str(f) in str(err) or "nodes" in str(err), str(err)

    check()


def _big_cluster(tmp_path, counts: list[int]):
    entries = "".join(f'''
[[nodes]]
name = "n{i}-"
count = {c}
gpus = 8
learners = 8
buffers = 1
actors = 10
learner_gpu_bytes = "8 GB"
learner_host_bytes = "64 GB"
buffer_host_bytes = "64 GB"
gpu_host = {{ bandwidth_gbps = 55.0 }}
shm = {{ bandwidth_gbps = 150.0 }}
nic = {{ bandwidth_gbps = 400.0 }}
''' for i, c in enumerate(counts))
    f = tmp_path / "big.toml"
    f.write_text('name = "big"\n' + entries)
    return f


@pytest.mark.parametrize(("counts", "fragment"), [
    ([50000], "nodes[0].count must be between 1 and 2048 (the nodes a plan can be computed "
              "for here), got 50000"),
    ([1500, 1500], "nodes must be at most 2048 nodes (the planner's memory grows with the "
                   "square of the nodes), got '3000 nodes'"),
])
def test_a_cluster_the_planner_cannot_hold_is_refused_at_load(tmp_path, counts: list[int],
                                                              fragment: str) -> None:
    """Before: count = 50000 (under the old limit of 100,000) ran the planner out of
    memory (18.6 GiB for a nodes x nodes matrix) on every rank that planned."""
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        ClusterModel.from_toml(_big_cluster(tmp_path, counts))


def test_a_plan_at_the_node_limit_fits_in_bounded_memory(tmp_path) -> None:
    """The largest cluster a file may describe plans within 1.5 GB of address space (the
    old dense node-to-node link matrix alone was 32 MB at this size, 18.6 GiB at 50,000)."""
    import resource
    import subprocess
    import sys

    from conduit_hpc.placement.clusterfile import MAX_NODES

    f = _big_cluster(tmp_path, [MAX_NODES])

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 29, 3 << 29))

    out = subprocess.run([sys.executable, "-m", "conduit_hpc.tools.cli", "plan", str(f)],
                         capture_output=True, text=True, timeout=240, check=False,
                         preexec_fn=limit, env={**os.environ, "OMP_NUM_THREADS": "1",
                                                "OPENBLAS_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"{MAX_NODES} nodes" in out.stdout
