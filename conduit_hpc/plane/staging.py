"""Device staging: the one place that moves batches from host memory to the learner's
device (the node-local GPU, bound by node-local learner index, or the CPU).

Host arrays are handed to torch without a copy on the CPU; for a GPU they are pinned and
copied on a side stream, and :class:`Batch` carries the CUDA event the learner waits on
(:meth:`Batch.wait`), so the copy of batch ``s+1`` overlaps compute on batch ``s``.
"""

from __future__ import annotations

import abc
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from conduit_hpc.errors import CollectiveFailed, ConfigError, SpecError
from conduit_hpc.spec import as_array
from conduit_hpc.wait import wait_until

if TYPE_CHECKING:  # torch loads only on ranks that use it (learners)
    import torch

    from conduit_hpc.plane.roles import RoleComms
    from conduit_hpc.spec import Spec

__all__ = ["Batch", "BatchSink", "Recycler", "Stager", "agreed_device", "checked_transform",
           "import_torch", "select_device"]


def import_torch(layout_learners: int) -> None:
    """Import torch on this rank if the job has learners: every rank of the data plane's
    constructor calls it before the constructor's first bounded wait. Local.

    A learner's device choice (:func:`agreed_device`) imports torch; done there alone,
    its first import (1-3 s on an idle node, 30-40 s at load 20 on 2 cores) ran while
    every other rank waited for the learner, bounded by ``run.timeout_s``, and past it
    they raised :class:`~conduit_hpc.errors.CollectiveFailed` ("a rank failed, left
    without an error, or did not arrive") about a learner that was only importing. Done
    here on every rank at once, the import costs no rank a wait (and ~190 MB of memory
    on ranks that do not use torch: buffers, delivery ranks)."""
    if layout_learners > 0:
        import torch  # noqa: F401


def select_device(kind: str, local_learner_index: int) -> torch.device:
    """The learner's device: its node-local GPU (bound by node-local learner index,
    never by world rank) when asked for or available, else the CPU.

    Raises:
        ConfigError: ``scheduler.device = "cuda"`` but torch sees no GPU.
    """
    import torch

    if kind in ("auto", "cuda") and torch.cuda.is_available():
        return torch.device("cuda", local_learner_index % torch.cuda.device_count())
    if kind == "cuda":
        raise ConfigError("scheduler.device must be 'auto' or 'cpu' on this machine: "
                          "'cuda' was asked for but torch sees no GPU",
                          key="scheduler.device")
    return torch.device("cpu")


def agreed_device(roles: RoleComms, kind: str, timeout_s: float) -> torch.device | None:
    """This learner's device (``None`` on other roles), agreed: a GPU may be missing on
    some node only, and then every rank raises together. **Collective** on the world,
    bounded by ``timeout_s`` (a rank that hangs or died in the constructor before it).

    Raises:
        ConfigError: some learner cannot have the device asked for (on every rank).
        CollectiveFailed: not every rank came within ``timeout_s``.
    """
    from mpi4py import MPI

    device, problem = None, ""
    me = roles.world_rank
    if me in roles.learner_ranks:
        local = [r for r in roles.learner_ranks if roles.same_node(r, me)].index(me)
        try:
            device = select_device(kind, local)
        except ConfigError as err:
            problem = f"on world rank {me}: {err}"
    worst = np.zeros(1, dtype=np.int64)
    mine = np.array([1 if problem else 0], dtype=np.int64)
    req = roles.world.Iallreduce(mine, worst, op=MPI.MAX)
    try:
        wait_until(req.Test, timeout_s=timeout_s, error=CollectiveFailed,
                   what=f"every rank of {roles.world_size} to reach the data plane's "
                        f"constructor (the learners' device)",
                   detail="a rank failed, left without an error, or did not arrive")
    except CollectiveFailed:
        _ABANDONED.append((req, mine, worst))  # MPI may still write them
        raise
    if worst[0]:
        raise ConfigError(problem or "scheduler.device must be 'auto' or 'cpu': 'cuda' was "
                          "asked for but a learner's torch sees no GPU",
                          key="scheduler.device")
    return device


#: requests of :func:`agreed_device` given up on, with their buffers
_ABANDONED: list[tuple[Any, np.ndarray, np.ndarray]] = []


@dataclass
class Batch:
    """One learner batch.

    Attributes:
        data (dict[str, torch.Tensor]): one tensor per field (``[B, ...]``, or
            ``[B, L, ...]`` for sequences), on the learner's device.
        indices (np.ndarray): int64 ``[B, 3]``: shard, slot, generation of each row
            (the first row of a sequence); pass back to ``update_priorities``.
        weights (torch.Tensor): float32 ``[B]`` importance weights (1 when uniform).
        superstep (int): the superstep this batch is for.
        staleness (int): supersteps of priority updates this batch was sampled without.
        timings (dict[str, float]): seconds spent on sample, gather, transform, copy.
    """

    data: dict[str, torch.Tensor]
    indices: np.ndarray
    weights: torch.Tensor
    superstep: int
    staleness: int
    timings: dict[str, float] = field(default_factory=dict)
    ready: Any = None  # a CUDA event when the copy is asynchronous

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.data[name]

    def __len__(self) -> int:
        return len(self.indices)

    def wait(self) -> None:
        """Block until the device copy is done (no-op on the CPU)."""
        if self.ready is not None:
            self.ready.synchronize()
            self.ready = None


class BatchSink(abc.ABC):
    """Where the experience path hands a finished batch (the last stage of
    :class:`~conduit_hpc.plane.delivery.Deliverer`): the learner's device
    (:class:`Stager`), or the staging ring a delivery rank writes for its learner
    (:class:`~conduit_hpc.plane.staging_ring.SlotWriter`)."""

    #: the device whose memory mirrors ``learner_gpu`` shards (None: no device tier)
    device: torch.device | None = None

    def alloc(self, t: int, spec: Spec, lead: tuple[int, ...]) -> dict[str, np.ndarray]:
        """The columns batch ``t`` is gathered into (``lead``: its leading dimensions,
        ``[B]`` or ``[B, L]``); default: fresh arrays."""
        return {f.name: np.empty((*lead, *f.shape), dtype=f.dtype) for f in spec}

    @abc.abstractmethod
    def to_device(self, data: Mapping[str, np.ndarray], indices: np.ndarray,
                  weights: np.ndarray, superstep: int, staleness: int,
                  device_rows: Sequence[tuple[np.ndarray, Mapping[str, torch.Tensor]]] = ()
                  ) -> Batch:
        """The batch, where the learner takes it from (see the subclasses)."""


def _refs(cols: Mapping[str, np.ndarray]) -> int:
    """The most references any of ``cols``' arrays has (measured the same way as
    :data:`_UNUSED`)."""
    return max(sys.getrefcount(v) for v in cols.values())


#: what :func:`_refs` reads for arrays held by nothing but their dict
_UNUSED = _refs({"x": np.empty(1)})


def _set_refs() -> int:
    """What ``sys.getrefcount`` reads for a set of columns held by nothing but the
    pool's list, in :meth:`Recycler.take`'s loop."""
    sets = [{"x": np.empty(1)}]
    for cols in sets:
        return sys.getrefcount(cols)
    raise AssertionError


_SET_UNUSED = _set_refs()


class Recycler:
    """Batch columns, reused once nothing refers to them any more.

    A batch handed to torch on the CPU is a view of its numpy columns
    (``torch.from_numpy``: the tensor holds a reference to the array until its storage
    is freed, and so does every view or ``.numpy()`` of it; a transform's view holds the
    array as its ``base``). A set of columns whose arrays have no reference left but
    this pool's is free: the next batch is gathered into it, into pages that are
    already mapped. In a plain process, with the previous batch still held (as
    ``b = next_batch()`` holds it), fresh arrays cost 4x at batch 32 and 2x at 256 for
    Atari rows (``bench/README.md``, "Round 4"); a batch a user keeps is never written
    over (its
    set stays referenced; a new set is made, up to ``budget_bytes``, then fresh arrays
    that are not kept). A set is free when neither its dict nor any of its arrays has a
    reference but the pool's; references are only dropped on other threads meanwhile
    (one is only added by a holder of another), so a set seen free stays free.

    Args:
        budget_bytes (int): most bytes of columns kept (at least two sets are kept).
    """

    def __init__(self, budget_bytes: int = 128 << 20) -> None:
        self.budget = int(budget_bytes)
        self.sets: list[dict[str, np.ndarray]] = []
        self._key: tuple[Any, ...] | None = None
        self._spec: Spec | None = None  # the spec and lead of the last take
        self._lead: tuple[int, ...] | None = None
        self.reused = 0  # batches gathered into a set used before

    def take(self, spec: Spec, lead: tuple[int, ...]) -> dict[str, np.ndarray]:
        """Columns for one batch of ``spec`` rows (``lead``: leading dimensions)."""
        if spec is not self._spec or lead != self._lead:  # (the key once per spec)
            key = (lead, tuple((f.name, f.dtype.str, f.shape) for f in spec))
            if key != self._key:  # another batch shape or spec: the old sets go
                self.sets, self._key = [], key
            self._spec, self._lead = spec, lead
        for cols in self.sets:  # free: neither the dict nor any array is referred to
            if sys.getrefcount(cols) <= _SET_UNUSED and _refs(cols) <= _UNUSED:
                self.reused += 1
                return cols
        new = {f.name: np.empty((*lead, *f.shape), dtype=f.dtype) for f in spec}
        nbytes = sum(v.nbytes for v in new.values())
        if len(self.sets) < max(2, self.budget // max(nbytes, 1)):
            self.sets.append(new)
        return new


class Stager(BatchSink):
    """Hands numpy batches to torch on ``device`` (see the module docstring). Batches
    are gathered into recycled columns (:class:`Recycler`).

    Args:
        device (torch.device): the learner's device.
    """

    device: torch.device

    def __init__(self, device: torch.device) -> None:
        import torch

        self._torch = torch
        self.device = device
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.recycler = Recycler()

    def alloc(self, t: int, spec: Spec, lead: tuple[int, ...]) -> dict[str, np.ndarray]:
        return self.recycler.take(spec, lead)

    def to_device(self, data: Mapping[str, np.ndarray], indices: np.ndarray,
                  weights: np.ndarray, superstep: int, staleness: int,
                  device_rows: Sequence[tuple[np.ndarray, Mapping[str, torch.Tensor]]] = ()
                  ) -> Batch:
        """A :class:`Batch` of ``data`` on the device (asynchronous on a GPU).
        ``device_rows``: (batch positions, columns already on the device) - rows of the
        ``learner_gpu`` tier, written over those positions of the batch on the device."""
        torch = self._torch
        if self._stream is None:
            tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in data.items()}
            self._place(tensors, device_rows)
            return Batch(tensors, indices, torch.from_numpy(weights), superstep, staleness)
        # the device rows were gathered on this thread's stream: the side stream waits
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            tensors = {k: torch.from_numpy(np.ascontiguousarray(v)).pin_memory().to(
                self.device, non_blocking=True) for k, v in data.items()}
            self._place(tensors, device_rows)
            wt = torch.from_numpy(weights).pin_memory().to(self.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._stream)
        return Batch(tensors, indices, wt, superstep, staleness, ready=event)

    def _place(self, tensors: dict[str, torch.Tensor],
               device_rows: Sequence[tuple[np.ndarray, Mapping[str, torch.Tensor]]]) -> None:
        """Write each part's device columns over its positions of the batch, on the
        batch's device (rows of the ``learner_gpu`` tier never pass through the host);
        on a GPU inside the copy stream, after the host rows."""
        torch = self._torch
        for pos, cols in device_rows:
            idx = torch.as_tensor(np.asarray(pos, np.int64), device=self.device)
            for k, t in tensors.items():
                src = cols[k]
                # uint16/32/64 columns are kept as the signed type of their width on the
                # device (storage/device.py): write the bits through a view
                dst = t.view(src.dtype) if t.dtype != src.dtype and \
                    t.dtype.itemsize == src.dtype.itemsize and not t.dtype.is_floating_point \
                    else t
                dst.index_copy_(0, idx, src.to(dst.dtype))
                if self._stream is not None:  # read on the copy stream: keep it until then
                    src.record_stream(self._stream)


def checked_transform(data: Any, rows: int | None = None) -> dict[str, np.ndarray]:
    """What a learner's ``transform`` returned, as a dict of numpy arrays, or a
    :class:`SpecError` naming the transform (before the batch is staged: torch's or
    numpy's own error otherwise, raised from deep in the copy to the device).
    ``rows``: the batch's rows, which every column must keep (one per index and weight:
    a column of other length would pair rows with another row's index and weight)."""
    if not isinstance(data, Mapping):
        raise SpecError(f"transform must return a mapping of field name to array, got "
                        f"{type(data).__name__} {data!r:.80}")
    out = {k: as_array(v, f"transform output {k!r}") for k, v in data.items()}
    for k, v in out.items():
        if rows is not None and (v.ndim == 0 or v.shape[0] != rows):
            raise SpecError(f"transform output {k!r} has shape {list(v.shape)}; expected "
                            f"{rows} rows first (scheduler.batch_rows: one per entry of "
                            f"Batch.indices and Batch.weights)")
    return out
