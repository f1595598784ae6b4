"""A TorchRL replay buffer whose storage is the data plane.

:class:`DataPlaneReplayBuffer` takes and gives TensorDicts like TorchRL's
``TensorDictReplayBuffer`` / ``TensorDictPrioritizedReplayBuffer``, so that a TorchRL
script keeps its collectors, modules, loss and target updater, and only builds its buffer
differently::

    # plain TorchRL, one process
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, batch_size=64,
                                           storage=LazyTensorStorage(100_000))
    # on the data plane, under `conduit-hpc run` (alpha, beta, batch and capacity come
    # from [storage] and [scheduler])
    rb = DataPlaneReplayBuffer(edp, model=value_net, exclude_keys=EXCLUDED)

Collectors run on **actor** ranks and call :meth:`~DataPlaneReplayBuffer.extend`; the
loss runs on the **learner** rank and calls :meth:`~DataPlaneReplayBuffer.sample` and
:meth:`~DataPlaneReplayBuffer.update_tensordict_priority`; buffer ranks call
``edp.serve()``. Prioritized or uniform sampling follows ``scheduler.sampler``; in
``edp`` mode the next batches are prepared while the loss computes.

TensorDict keys map to spec fields by :mod:`conduit_hpc.integrations.keymap`
(:mod:`~conduit_hpc.integrations.columns` turns rows into columns and back)
(``("next", "observation")`` is the field ``next__observation``). ``extend`` checks the
TensorDict against the spec - every entry a field, every field an entry, the same dtype
and per-row shape - and raises :class:`~conduit_hpc.errors.SpecError` naming the key
before anything is written. The keys ``index``, ``priority_weight`` and the priority key
(``td_error``) are the buffer's own, never stored.

This module is the only one (with :mod:`~conduit_hpc.integrations.torchrl_fallback`) that
imports ``torchrl`` (``pip install 'conduit-hpc[torchrl]'``); ``tensordict`` also
:mod:`~conduit_hpc.integrations.columns`.
Importing it warns when TorchRL's C++ extension does not load with the installed torch
(see :func:`~conduit_hpc.integrations.torchrl_fallback.extension_problem`): this buffer
does not need it, TorchRL's own prioritized buffers do.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from conduit_hpc.errors import (
    ConduitError,
    ConfigError,
    DataPlaneClosed,
    SpecError,
    UsedAfterClose,
)
from conduit_hpc.integrations.columns import TensorDictColumns, spec_tables
from conduit_hpc.integrations.torchrl_fallback import TorchRLExtensionWarning, extension_problem
from conduit_hpc.integrations.torchrl_refused import TorchRLRefusals
from conduit_hpc.plane.control import C_INSERTS
from conduit_hpc.plane.front import ExperienceDataPlane
from conduit_hpc.plane.roles import Role
from conduit_hpc.spec import as_array
from conduit_hpc.storage.priority import check_priorities

__all__ = ["RESERVED_KEYS", "WEIGHT_KEY", "DataPlaneReplayBuffer", "TensorDictColumns",
           "spec_tables"]

#: the importance-weight key of TorchRL 0.14's prioritized samplers, which its losses
#: (``DQNLoss``...) read (older TorchRL releases wrote ``_weight``)
WEIGHT_KEY = "priority_weight"
#: keys a buffer writes into sampled TensorDicts (never stored): TorchRL's names
RESERVED_KEYS = ("index", WEIGHT_KEY)

_problem = extension_problem()
if _problem is not None:
    warnings.warn(TorchRLExtensionWarning(_problem), stacklevel=2)


class DataPlaneReplayBuffer(TorchRLRefusals):
    """A ``TensorDictPrioritizedReplayBuffer`` (or ``TensorDictReplayBuffer`` with
    ``scheduler.sampler = "uniform"``) backed by the data plane.

    With ``share_weights`` (the default) construction is **collective**: every rank
    builds its buffer (buffer ranks too, with ``model=None``, before ``edp.serve()``), and
    it calls :meth:`~conduit_hpc.ExperienceDataPlane.share_weights`: the learner publishes
    ``model``'s parameters every ``scheduler.weights_every`` updates and each
    :meth:`extend` on an actor loads newer ones into its copy - what
    ``collector.update_policy_weights_()`` does in one process. Without, it is local.

    Args:
        edp (ExperienceDataPlane): this rank's data plane.
        model (torch.nn.Module | None): the network the actors' policy uses (the same
            architecture on actors and learners; buffers pass ``None``).
        batch_size (int | None): must be ``scheduler.batch_rows`` if given.
        priority_key (str): the key the loss writes its TD error to (TorchRL's
            ``td_error``); also read at ``extend`` as initial priorities when present.
        exclude_keys (iterable of keys): TensorDict entries not to store (what the loss
            does not read, e.g. ``("collector", "traj_ids")``).
        share_weights (bool): publish ``model`` from the learner to the actors
            (collective, see above); ``False`` when the job calls ``share_weights``
            itself, or shares no weights.
        reduction (str): how a priority with more than one value per row becomes one:
            ``max`` (TorchRL's default), ``min``, ``mean`` or ``median``.
        eps (float): added to ``|td_error|`` (TorchRL's ``eps``).

    Raises:
        ConfigError: ``scheduler.sampler = "sequence"``, a ``batch_size`` other than
            ``scheduler.batch_rows``, an unknown ``reduction``, or a spec field that names
            no TensorDict key.
    """

    def __init__(self, edp: ExperienceDataPlane, *, model: torch.nn.Module | None = None,
                 batch_size: int | None = None, priority_key: str = "td_error",
                 exclude_keys: Iterable[Any] = (), reduction: str = "max",
                 eps: float = 1e-8, share_weights: bool = True) -> None:
        sch = edp.config.scheduler
        if sch.sampler not in ("prioritized", "uniform"):
            raise ConfigError(f"scheduler.sampler must be 'prioritized' or 'uniform' for "
                              f"the TorchRL buffer, got {sch.sampler!r}",
                              key="scheduler.sampler")
        if batch_size is not None and batch_size != sch.batch_rows:
            raise ConfigError(f"batch_size must be scheduler.batch_rows ({sch.batch_rows}) "
                              f"or None, got {batch_size!r}: the data plane prepares "
                              f"batches of one size ahead of the loss",
                              key="scheduler.batch_rows")
        if reduction not in ("max", "min", "mean", "median"):
            raise ConfigError(f"reduction must be 'max', 'min', 'mean' or 'median', got "
                              f"{reduction!r}", key="reduction")
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not (
                math.isfinite(eps) and eps >= 0):
            raise ConfigError(f"eps must be a finite number >= 0 (added to |priority|), "
                              f"got {eps!r}", key="eps")
        self.edp = edp
        self.batch_size = sch.batch_rows
        self.priority_key = priority_key
        self.prioritized = sch.sampler == "prioritized"
        self.reduction, self.eps = reduction, float(eps)
        self.columns = TensorDictColumns(edp.spec, exclude_keys,
                                         skip=(*RESERVED_KEYS, priority_key))
        self.keys = self.columns.keys
        self._chunk = min(sch.max_insert_batch,
                          min(s.capacity_rows for s in edp.placement.shards))
        self._capacity = edp.placement.capacity_rows
        self.last_batch: Any = None  # the plane's Batch behind the last sample()
        self._model = model if share_weights else None
        if share_weights:
            edp.share_weights(model)  # collective; raises on every rank if models differ

    # -- actor side (collectors) -----------------------------------------------------
    def check(self, td: TensorDictBase) -> dict[str, np.ndarray]:
        """``td``'s rows as spec columns (see :meth:`TensorDictColumns.columns`). Local.

        Raises:
            SpecError: ``td`` does not match the spec, naming the key and the field.
        """
        return self.columns.columns(td)

    def _initial_priorities(self, td: TensorDictBase, n: int) -> np.ndarray | None:
        p = td.get(self.priority_key, None) if self.prioritized else None
        return None if p is None else self._priority_vector(p, n)

    def extend(self, data: TensorDictBase) -> int:
        """Store ``data``'s rows (a collector's batch; leading dimensions flattened).
        Actor ranks; local and one-sided (blocks only as
        :meth:`~conduit_hpc.ExperienceDataPlane.ingest` does). With a ``priority_key``
        entry its ``|value| + eps`` are the rows' priorities, else they enter at the
        running maximum. Then newer published weights, if any, are loaded into ``model``.

        Returns:
            int: rows stored (TorchRL returns their indices; the data plane gives no row
            an index before a learner samples it).

        Raises:
            SpecError: ``data`` does not match the spec (see :meth:`check`).
            ConduitError: not an actor rank.
        """
        self._need(Role.ACTOR, "extend()", "collectors run on actor ranks")
        if not isinstance(data, TensorDictBase):
            raise SpecError(f"extend() takes a TensorDict (a collector's batch), got "
                            f"{type(data).__name__}")
        rows = data.reshape(-1) if data.batch_dims != 1 else data
        cols = self.check(rows)
        n = len(rows)
        prio = self._initial_priorities(rows, n)
        if prio is not None:  # every row's, before the first of the chunks is written
            prio = check_priorities(prio, f"priority ({self.priority_key!r})")
        for lo in range(0, n, self._chunk):
            part = {k: v[lo:lo + self._chunk] for k, v in cols.items()}
            self.edp.ingest(part, None if prio is None else prio[lo:lo + self._chunk])
        if self._model is not None:
            self.edp.pull_weights()
        return n

    def add(self, data: TensorDictBase) -> int:
        """Store one row (a TensorDict without batch dimensions). See :meth:`extend`."""
        if not isinstance(data, TensorDictBase):
            raise SpecError(f"add() takes a TensorDict, got {type(data).__name__}")
        return self.extend(data.unsqueeze(0))

    # -- learner side (the loss) -------------------------------------------------------
    def sample(self, batch_size: int | None = None, return_info: bool = False) -> Any:
        """The next batch as a TensorDict of ``scheduler.batch_rows`` rows on the
        learner's device, with ``index`` (int64 ``[B, 3]``: shard, slot, generation) and,
        when prioritized, ``priority_weight`` (importance weights, which TorchRL's losses
        apply). Learner ranks; blocks until
        the batch is ready (bounded by ``run.timeout_s``; in ``edp`` mode it was
        prepared while the previous loss computed).

        Raises:
            ConfigError: ``batch_size`` is not ``scheduler.batch_rows``.
            DataPlaneClosed: every actor finished before the replay held
                ``scheduler.min_fill_rows`` rows.
        """
        self._need(Role.LEARNER, "sample()", "the loss runs on learner ranks")
        if batch_size is not None and batch_size != self.batch_size:
            raise ConfigError(f"batch_size must be scheduler.batch_rows ({self.batch_size}) "
                              f"or None, got {batch_size!r}", key="scheduler.batch_rows")
        b = self.edp.next_batch()
        self.last_batch = b
        device = b.weights.device
        td = self.columns.tensordict(b.data, device)
        index = torch.from_numpy(b.indices).to(device)
        td.set("index", index)
        if self.prioritized:
            td.set(WEIGHT_KEY, b.weights)
        if return_info:
            info = {"index": index, **({WEIGHT_KEY: b.weights} if self.prioritized else {})}
            return td, info
        return td

    def __iter__(self) -> Iterator[TensorDictBase]:
        """Batches until the actors are done (see :meth:`sample`). Iterating after
        ``done()``/``close()`` raises :class:`~conduit_hpc.errors.UsedAfterClose` (it
        ended silently, as if the actors had finished)."""
        while True:
            try:
                yield self.sample()
            except UsedAfterClose:
                raise
            except DataPlaneClosed:
                return

    def _priority_vector(self, priority: Any, n: int) -> np.ndarray:
        """``|priority| + eps`` per row (``reduction`` over extra dimensions; a scalar for
        every row). Array-likes by :func:`conduit_hpc.spec.as_array`'s rule.

        Raises:
            SpecError: naming the priority key: not real numbers, or no value in a row.
        """
        what = f"priority ({self.priority_key!r})"
        arr = as_array(priority, what)
        if arr.dtype.kind == "c":
            raise SpecError(f"{what} must be real numbers, got dtype {arr.dtype}")
        p = np.abs(arr.astype(np.float64))
        if p.ndim == 0:
            p = np.full(n, float(p))
        elif p.ndim > 1:
            per_row = int(np.prod(p.shape[1:]))
            if per_row == 0:
                raise SpecError(f"{what}: shape {tuple(arr.shape)} holds no value per row; "
                                f"expected [n] or [n, ...] with values")
            flat = p.reshape(p.shape[0], per_row)
            # torch's median: the lower of the two middle values
            p = (np.quantile(flat, 0.5, axis=1, method="lower") if self.reduction == "median"
                 else getattr(np, self.reduction)(flat, axis=1))
        return p + self.eps

    def update_priority(self, index: Any, priority: Any) -> None:
        """New priorities ``|priority| + eps`` for sampled rows (``index`` as in a
        sampled TensorDict). Learner ranks; never blocks on the network; a no-op with
        the uniform sampler (as in TorchRL).

        Raises:
            SpecError: bad indices, lengths that differ, NaN or infinite priorities.
        """
        self._need(Role.LEARNER, "update_priority()", "the loss runs on learner ranks")
        if not self.prioritized:
            return
        idx = as_array(index, "index")
        if idx.ndim != 2 or idx.shape[1:] != (3,):
            raise SpecError(f"index must be the [n, 3] 'index' entry of a sampled "
                            f"TensorDict (shard, slot, generation), got shape "
                            f"{tuple(idx.shape)}")
        self.edp.update_priorities(idx, self._priority_vector(priority, len(idx)))

    def update_tensordict_priority(self, data: TensorDictBase) -> None:
        """Priorities from a sampled TensorDict that the loss has written its
        ``priority_key`` into (per row: ``reduction`` over extra dimensions). See
        :meth:`update_priority`.

        Raises:
            SpecError: ``data`` lacks ``index`` or the priority key.
        """
        if not self.prioritized:
            return
        if not isinstance(data, TensorDictBase | Mapping):
            raise SpecError(f"update_tensordict_priority takes the sampled TensorDict, got "
                            f"{type(data).__name__}")
        for k in ("index", self.priority_key):
            if k not in data:
                raise SpecError(f"update_tensordict_priority: the TensorDict has no {k!r} "
                                f"entry (sample() writes 'index', the loss writes "
                                f"{self.priority_key!r})")
        self.update_priority(data.get("index"), data.get(self.priority_key))

    # -- both --------------------------------------------------------------------------
    def __len__(self) -> int:
        """Rows the replay holds, job-wide (rows inserted, at most the capacity). Actor
        and learner ranks, until ``close()``; one atomic read (on a learner, where its
        MPI calls are made: it waits for the data-plane thread's turn)."""
        edp = self.edp
        if edp.serves:
            raise ConduitError("len() is for actor and learner ranks")
        if edp._closed:  # before: TransportError 'window used after close()'
            raise UsedAfterClose(f"len() called after close() on world rank "
                                 f"{edp.world_rank}: the replay's counters are freed")
        if edp.learner is not None:
            n = edp.learner.run_on_thread(lambda: edp.control.read(C_INSERTS), "len()")
        else:
            n = edp.control.read(C_INSERTS)
        return int(min(n, self._capacity))

    def _need(self, role: Role, what: str, why: str) -> None:
        if self.edp.role is not role:
            raise ConduitError(f"{what} is for {role.value} ranks ({why}); world rank "
                               f"{self.edp.world_rank} has the role {self.edp.role.value!r}")

    def __repr__(self) -> str:
        kind = "prioritized" if self.prioritized else "uniform"
        return (f"DataPlaneReplayBuffer({kind}, batch_size={self.batch_size}, "
                f"mode={self.edp.config.scheduler.mode!r}, fields={list(self.keys)})")
