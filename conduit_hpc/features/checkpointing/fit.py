"""Why a checkpoint does not fit the job that resumes from it, beyond its spec (which
:func:`~conduit_hpc.checkpoint.open_checkpoint` checks): each function returns the
reason ("" when it fits), which the resume refuses as a
:class:`~conduit_hpc.errors.CheckpointMismatch` (skipped by ``"latest"``, never marked
damaged). Local and pure: the checkpoint's records and this job's config only."""

from __future__ import annotations

from collections.abc import Sequence

from conduit_hpc import checkpoint as ck
from conduit_hpc.config import Config, tomllib
from conduit_hpc.spec import FrameStack, Spec, frame_stacks

__all__ = ["forward_problem", "stacks_problem", "window_problem"]


def stacks_problem(ckpt: ck.Checkpoint, spec: Spec) -> str:
    """Why a checkpoint whose stored columns match ``spec``'s cannot be restored into it
    ("" if it can): a stacked field of another depth. The columns hold the frame shape
    and the references per row, so stacks of 4 with a next stack and of 8 without one
    store alike, and the references would rebuild other stacks. The checkpoint's config
    says its stacks; one that does not (written by hand) is taken as it is. Local."""
    if not spec.stacks:
        return ""
    try:
        table = tomllib.loads(ckpt.config_toml).get("spec")
        theirs = frame_stacks(Config.from_dict({"spec": table}).spec) if table else {}
    except (tomllib.TOMLDecodeError, ValueError):  # (ConfigError is a ValueError)
        return ""
    for name, st in spec.stacks.items():
        old = theirs.get(name)
        if old is not None and old.depth != st.depth:
            return (f"checkpoint {ckpt.path} stores spec.{name} as a stack of "
                    f"{_stack_words(old)}, this job declares {_stack_words(st)}: its "
                    f"frame references would rebuild other stacks")
    return ""


def forward_problem(ckpt: ck.Checkpoint, mode: str, capacities: Sequence[int]) -> str:
    """Why a checkpoint written with ``longhaul.mode = "forward"`` cannot be restored
    into a job of long-haul ``mode`` with shards of ``capacities`` ("" if it can): its
    shard 0 is the edge's FIFO, whose
    forwarded rows the data-centre replay (shard 1) holds too, so only the same shards
    (``forward`` again, the same ``storage.capacity_rows``) take it back; resharding
    would deal every such row twice. Local."""
    try:
        theirs = tomllib.loads(ckpt.config_toml).get("longhaul", {}).get("mode", "off")
    except (tomllib.TOMLDecodeError, AttributeError):
        return ""  # a config that says nothing readable (written by hand): as it is
    if theirs != "forward" or (mode == "forward" and list(capacities) == ckpt.capacities):
        return ""
    return (f"checkpoint {ckpt.path} was written with longhaul.mode = 'forward' (shards of "
            f"{ckpt.capacities} rows: the edge's FIFO, then the data-centre replay, which "
            f"holds the forwarded rows again); this job has longhaul.mode = {mode!r} and "
            f"shards of {list(capacities)} rows: expected longhaul.mode = 'forward' with "
            f"the same storage.capacity_rows (any other layout would hold forwarded rows "
            f"twice)")


def window_problem(ckpt: ck.Checkpoint, config: Config, capacities: Sequence[int],
                   stacked: bool = False) -> str:
    """Why a checkpoint cannot be restored into a job whose sampler draws windows of
    consecutive rows (``scheduler.sampler = "sequence"``) with shards of ``capacities``
    (``stacked``: its spec declares frame stacks) ("" if it can): resharding deals a
    shard's rows to the new shards one by one (and merges several shards' rows by age),
    so a new shard's neighbouring rows are no longer a stream's consecutive steps -
    every window would hold every other step, across episode ends, with no word. One
    shard into one shard keeps the order, and an empty checkpoint has no windows. Local."""
    window = config.scheduler.window
    old = ckpt.capacities
    one_to_one = len(old) == len(capacities) == 1 and not stacked
    if window <= 1 or not ckpt.rows or old == list(capacities) or one_to_one:
        return ""
    st, lay = config.storage, config.layout
    return (f"checkpoint {ckpt.path} holds {len(old)} shard(s) of {old} rows, this job "
            f"has {len(capacities)} of {list(capacities)} (storage.capacity_rows = "
            f"{st.capacity_rows}, layout.buffers = {lay.buffers}, "
            f"storage.shards_per_buffer = {st.shards_per_buffer}), and "
            f"scheduler.sampler = {config.scheduler.sampler!r} draws windows of {window} "
            f"consecutive rows: resharding would deal each stream's steps over several "
            f"shards and break every window; expected the checkpoint's shard capacities "
            f"{old} (as many shards, storage.capacity_rows = {sum(old)})")


def _stack_words(st: FrameStack) -> str:
    return f"{st.depth} frames" + (f" with its next stack {st.next_field}" if st.next_field
                                   else ", no next stack")
