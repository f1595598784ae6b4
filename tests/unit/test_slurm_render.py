"""`conduit-hpc slurm` renders scripts bash accepts, with values from the job's [layout],
and refuses layouts that cannot fit (the SLURM run itself: tests/launch/test_slurm.py)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from conduit_hpc.config import LayoutConfig
from conduit_hpc.errors import ConfigError
from conduit_hpc.testing import REPO
from conduit_hpc.tools.slurm import SlurmRequest, plan_tasks, render_sbatch

JOB = REPO / "jobs" / "synthetic.toml"


def sbatch_options(text: str) -> dict[str, str]:
    return dict(re.findall(r"^#SBATCH --([\w-]+)=?(\S*)", text, flags=re.M))


def bash_ok(text: str, tmp_path: Path) -> None:
    f = tmp_path / "job.sbatch"
    f.write_text(text)
    out = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True, timeout=30,
                         check=False)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(
    ("sets", "req", "tasks_per_node", "gpus", "roles"),
    [
        ((), SlurmRequest(nodes=1), 6, 0, "rank 0 learner, rank 1 buffer, ranks 2-5 actors"),
        (("layout.actors=0",), SlurmRequest(nodes=2, ntasks_per_node=4), 4, 1,
         "ranks 2-7 actors"),
        (("layout.per_node=true", "layout.actors=0"),
         SlurmRequest(nodes=4, ntasks_per_node=8, launcher="mpirun"), 8, 1,
         "per node: rank 0 learner, rank 1 buffer, ranks 2-7 actors"),
        (("layout.per_node=true", "layout.learners=2", "layout.buffers=2", "layout.actors=4"),
         SlurmRequest(nodes=16, gpus_per_node=4, partition="gpu", account="rl",
                      modules=("cuda/12.4",), sbatch=("--qos=high",)), 8, 4,
         "per node: ranks 0-1 learners, ranks 2-3 buffers, ranks 4-7 actors"),
        (("layout.learners=3", "layout.actors=10"), SlurmRequest(nodes=2), 7, 3,
         "ranks 0-2 learners"),
    ],
)
def test_renders_valid_scripts_for_several_layouts(tmp_path, sets, req, tasks_per_node, gpus,
                                                   roles) -> None:
    req = SlurmRequest(**{**{f: getattr(req, f) for f in req.__dataclass_fields__},
                          "overrides": sets})
    text = render_sbatch(JOB, req)
    bash_ok(text, tmp_path)
    opts = sbatch_options(text)
    assert opts["nodes"] == str(req.nodes)
    assert opts["ntasks-per-node"] == str(tasks_per_node)
    assert opts.get("gpus-per-node", "0") == str(gpus)
    assert "requeue" in opts and opts["signal"] == "B:TERM@120"
    assert roles in text
    assert f"tools/scripts/launch_{req.launcher}.sh " in text
    assert f"-n {tasks_per_node * req.nodes} " in text
    if req.partition:
        assert opts["partition"] == "gpu" and opts["account"] == "rl" and opts["qos"] == "high"
        assert "module load cuda/12.4" in text
    for s in sets:
        assert f"--set {s}" in text
    assert "{{" not in text


def test_no_requeue_and_no_signal(tmp_path) -> None:
    text = render_sbatch(JOB, SlurmRequest(requeue=False, signal_s=0))
    bash_ok(text, tmp_path)
    opts = sbatch_options(text)
    assert "requeue" not in opts and "signal" not in opts
    assert "export CONDUIT_REQUEUE=0" in text


@pytest.mark.parametrize(
    ("layout", "req", "fragments"),
    [
        (LayoutConfig(learners=1, buffers=1, per_node=True), SlurmRequest(ntasks_per_node=2),
         ["--ntasks-per-node must be >= 3", "more roles than tasks", "got 2"]),
        (LayoutConfig(learners=1, buffers=1, actors=4, per_node=True),
         SlurmRequest(ntasks_per_node=8), ["--ntasks-per-node must be 6", "got 8"]),
        (LayoutConfig(learners=1, buffers=1, actors=4), SlurmRequest(nodes=4),
         ["--nodes 4 cannot hold", "exactly 6 ranks", "layout.actors = 0"]),
        (LayoutConfig(learners=2, buffers=2, actors=0), SlurmRequest(nodes=2, ntasks_per_node=2),
         ["2 x --ntasks-per-node 2 = 4 tasks", "needs 5", "more roles than tasks"]),
        (LayoutConfig(learners=1, buffers=1, actors=4), SlurmRequest(nodes=2, ntasks_per_node=4),
         ["= 8 tasks", "uses exactly 6"]),
        (LayoutConfig(learners=2, buffers=1, per_node=True),
         SlurmRequest(nodes=2, gpus_per_node=1), ["--gpus-per-node must be >= 2", "got 1"]),
    ],
)
def test_refuses_impossible_layouts(layout, req, fragments) -> None:
    with pytest.raises(ConfigError) as info:
        plan_tasks(layout, req)
    for f in fragments:
        assert f in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [({"nodes": 0}, "--nodes must be >= 1, got 0"),
     ({"time": "soon"}, "--time must be a SLURM time"),
     ({"launcher": "mpiexec"}, "--launcher must be srun or mpirun, got 'mpiexec'"),
     ({"sbatch": ("qos=high",)}, "--sbatch must be a long sbatch option")],
)
def test_bad_requests_name_the_option(kwargs, fragment) -> None:
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        SlurmRequest(**kwargs)


def test_one_node_template_refuses_several_nodes() -> None:
    with pytest.raises(ConfigError, match="one-node is for 1 node"):
        render_sbatch(JOB, SlurmRequest(nodes=2, template="one-node",
                                        overrides=("layout.actors=0",)))
