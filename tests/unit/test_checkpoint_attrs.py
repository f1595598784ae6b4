"""Checkpoints a plain h5py user understands: every dataset says what it holds (n and
gamma of the n-step fields, alpha not applied to the priority), the learner's arrays are
reachable from the manifest, Adam's state is named by parameter, and ``inspect`` shows it.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from conduit_hpc import CheckpointError, ConfigError
from conduit_hpc import checkpoint as ck
from conduit_hpc.config import FieldConfig
from conduit_hpc.rl import DQNSection, DQNUpdater, QNetwork, describe_transitions
from conduit_hpc.spec import Spec
from conduit_hpc.storage.snapshot import ShardSnapshot

FIELDS = {"obs": FieldConfig(dtype="float32", shape=(4,)), "action": FieldConfig(dtype="int64"),
          "reward": FieldConfig(dtype="float32"),
          "next_obs": FieldConfig(dtype="float32", shape=(4,)),
          "discount": FieldConfig(dtype="float32"),
          "mask": FieldConfig(dtype="uint8", description="my own words", units="bits")}


def trained_updater() -> DQNUpdater:
    torch.manual_seed(0)
    up = DQNUpdater(DQNSection(), QNetwork(4, 2, (8,)))
    rng = np.random.default_rng(1)
    batch = {"obs": rng.standard_normal((6, 4)).astype(np.float32),
             "action": rng.integers(0, 2, 6), "reward": np.ones(6, np.float32),
             "next_obs": rng.standard_normal((6, 4)).astype(np.float32),
             "discount": np.full(6, 0.9, np.float32)}
    for _ in range(3):
        up.update(batch, None)
    return up


def write_checkpoint(root: Path, spec: Spec, up: DQNUpdater) -> Path:
    rows = 5
    cols = {f.name: np.ones((rows, *f.shape), f.dtype) for f in spec}
    snap = ShardSnapshot(shard_id=0, capacity=8, commit=rows, seqs=np.arange(rows),
                         columns=cols, priority=np.linspace(0.1, 1, rows),
                         init_priority=np.full(rows, np.nan), max_priority=1.0)
    tmp = root / ".tmp-ckpt-000001-1"
    tmp.mkdir(parents=True)
    rec = ck.write_shard_file(tmp / "buffer-0000.h5", [snap],
                              described=ck.dataset_attrs(spec, alpha=0.6))
    learner = ck.write_arrays_file(tmp / ck.LEARNER_FILE, up.state_arrays(), up.state_attrs())
    parts = [{"world_rank": 1, "role": "buffer", "files": [rec["file"]],
              "shards": rec["shards"]},
             {"world_rank": 0, "role": "learner", "files": [learner], "shards": []}]
    manifest = ck.write_manifest(
        tmp, seq=1, spec=spec, config_toml="", alpha=0.6,
        layout={"world_size": 2}, parts=parts,
        placement={"shards": [{"shard_id": 0, "owner_rank": 1, "tier": "buffer_host",
                               "capacity_rows": 8}]})
    final = root / ck.checkpoint_name(1)
    ck.finalize(tmp, final, manifest)
    return final


def test_a_plain_h5py_reader_sees_what_each_dataset_means(tmp_path: Path) -> None:
    spec = Spec.from_config(describe_transitions(FIELDS, n_step=3, gamma=0.99))
    up = trained_updater()
    path = write_checkpoint(tmp_path, spec, up)
    with h5py.File(path / ck.MANIFEST, "r") as f:
        reward = f["experience/reward"].attrs
        assert "n = 3" in reward["description"] and "gamma = 0.99" in reward["description"]
        assert "0.970299" in f["experience/discount"].attrs["description"]  # 0.99 ** 3
        assert f["experience/mask"].attrs["description"] == "my own words"
        assert f["experience/mask"].attrs["units"] == "bits"
        prio = f["index/priority"].attrs
        assert not prio["alpha_applied"] and prio["alpha"] == pytest.approx(0.6)
        for name in ("seq", "shard"):
            assert f[f"index/{name}"].attrs["description"]
        assert f["shards/commit"].attrs["units"] == "rows"
        # the networks through the manifest, with no knowledge of learner.h5
        w = f["weights/online/body.0.weight"]
        assert np.array_equal(w[()], up.online.state_dict()["body.0.weight"].numpy())
        assert "online Q-network" in w.attrs["description"]
        adam = f["weights/adam/body.0.weight/exp_avg"]
        assert "first moment" in adam.attrs["description"]
        assert f["weights/adam/body.0.weight/step"].attrs["units"] == "optimizer steps"
    with h5py.File(path / "buffer-0000.h5", "r") as f:  # the shard file says it too
        assert "n = 3" in f["shards/0/columns/reward"].attrs["description"]
        assert not f["shards/0/priority"].attrs["alpha_applied"]
    report = ck.inspect_checkpoint(path, verify=True)
    assert report["ok"], report["error"]  # checksums still hold with the attributes
    text = ck.format_report(report)
    assert "/experience/reward: n-step discounted return" in text
    assert "alpha_applied = False" in text and "/weights/adam/body.0.weight/exp_avg" in text


def test_adam_state_is_named_by_parameter_and_old_numbered_state_still_loads() -> None:
    up = trained_updater()
    arrays = up.state_arrays()
    names = [n for n, _ in up.online.named_parameters()]
    assert sorted({k.split("/")[1] for k in arrays if k.startswith("adam/")}) == sorted(names)
    numbered = {}  # how checkpoints written before the names stored it
    for k, v in arrays.items():
        parts = k.split("/")
        numbered["/".join(["adam", str(names.index(parts[1])), parts[2]])
                 if parts[0] == "adam" else k] = v
    for state in (arrays, numbered):
        other = DQNUpdater(DQNSection(), QNetwork(4, 2, (8,)))
        other.load_state_arrays(state)
        for i, name in enumerate(names):
            got = other.opt.state_dict()["state"][i]["exp_avg"].numpy()
            assert np.array_equal(got, arrays[f"adam/{name}/exp_avg"])
    with pytest.raises(KeyError, match="names no parameter"):
        DQNUpdater(DQNSection(), QNetwork(4, 2, (8,))).load_state_arrays(
            {**arrays, "adam/body.9.weight/exp_avg": np.zeros(3)})


def test_descriptions_are_checked_and_optional() -> None:
    with pytest.raises(ConfigError, match="description"):
        FieldConfig(dtype="float32", description="a\x00b")
    old = [{"name": "reward", "dtype": "<f4", "shape": [], "allow_nan": True}]
    assert ck.spec_from_json(old)["reward"].description == ""  # a manifest from before
    with pytest.raises(CheckpointError, match="not stored"):
        ck.write_arrays_file(Path("/nonexistent/x.h5"), {"a": np.zeros(1)},
                             {"b": {"description": "?"}})
