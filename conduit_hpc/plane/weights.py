"""Weights from the lead learner to actors: a seqlocked board in one-sided memory.

The lead learner publishes its parameters and floating-point buffers (BatchNorm's
running statistics: an actor's policy in eval mode uses them), float32, flattened, every
``scheduler.weights_every`` supersteps with plain stores into its own segment; actors
pull newer ones with one-sided reads (numpy copies on the same node).
"""

from __future__ import annotations

import hashlib
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from conduit_hpc.errors import ConduitError, ConfigError, DataPlaneClosed
from conduit_hpc.transport.objects import bounded_allgather
from conduit_hpc.transport.rma import RmaWindow

if TYPE_CHECKING:  # torch loads only on ranks that share weights
    import torch

__all__ = ["WeightsBoard", "agreed_model_size", "check_share", "flat_parameters", "load_flat",
           "model_layout", "open_board"]


class WeightsBoard:
    """The lead learner's parameters, published for actors (seqlock on a version).

    Layout in the owner's segment: int64 ``[version, superstep, nparams, 0 ...]`` (64
    bytes) then float32 parameters. ``version`` is odd while the owner writes.

    Args:
        window (RmaWindow): window holding the board.
        owner (int): lead learner's rank.
        nparams (int): float32 parameters.
    """

    def __init__(self, window: RmaWindow, owner: int, nparams: int) -> None:
        self.window, self.owner, self.nparams = window, owner, nparams
        self.seen_version = 0
        self.seen_superstep = -1
        self._loading = threading.Lock()  # load_newer: one thread at a time
        # (version, superstep) loaded into each model other than the shared one
        self._others: weakref.WeakKeyDictionary[Any, tuple[int, int]] = (
            weakref.WeakKeyDictionary())

    def check(self, flat: np.ndarray) -> None:
        """Raise ConfigError unless ``flat`` fits the board (the model given to
        ``share_weights`` changed size since: a layer replaced or added). Local."""
        if len(flat) != self.nparams:
            raise ConfigError(f"model: the shared model now has {len(flat)} parameter and "
                              f"buffer values; share_weights() agreed {self.nparams} with "
                              f"the actors (a layer replaced after share_weights?); "
                              f"expected the model of that size", key="model")

    def publish(self, flat: np.ndarray, superstep: int) -> None:
        """Owner only: store new parameters. Local (direct stores + memory barrier).

        Raises:
            ConfigError: ``flat`` is not of the agreed size (nothing written: the
                version stays even, the actors keep the last weights)."""
        self.check(flat)
        seg = self.window.own_segment()
        head = seg[:64].view(np.int64)
        v = int(head[0])
        head[0] = v + 1
        self.window.sync()
        seg[64:64 + 4 * self.nparams].view(np.float32)[:] = flat
        head[1] = superstep
        head[2] = self.nparams
        self.window.sync()
        head[0] = v + 2
        self.window.sync()

    def published(self) -> tuple[int, int]:
        """(version, learner superstep) of the newest publication. Blocks for a read."""
        v = self.window.atomic_read(self.owner, 0)
        s = self.window.atomic_read(self.owner, 8)
        return v, s

    def pull(self) -> np.ndarray | None:
        """Newer parameters than last pulled, or ``None``. One-sided; blocks for the
        copy."""
        got = self._read(self.seen_version)
        if got is None:
            return None
        flat, self.seen_version, self.seen_superstep = got
        return flat

    def load_newer(self, model: Any, shared: Any) -> bool:
        """Load parameters newer than ``model`` holds into it (:func:`load_flat`;
        ``shared``: the model given to ``share_weights``, whose version is
        :attr:`seen_superstep`; any other model's is kept apart). Threads calling it at
        once take turns, so that a model never holds parameters of two publications and
        its version names the ones it holds. Returns whether there were newer ones.
        One-sided; blocks for the copy.

        Raises:
            ConfigError: see :func:`load_flat` (the model's version is kept).
        """
        with self._loading:
            mine = model is shared
            try:
                seen = self.seen_version if mine else self._others.get(model, (0, -1))[0]
            except TypeError:  # not a module (no weak reference): load_flat says so
                seen = 0
            got = self._read(seen)
            if got is None:
                return False
            load_flat(model, got[0], like=shared)
            if mine:
                self.seen_version, self.seen_superstep = got[1], got[2]
            else:
                self._others[model] = got[1:]
            return True

    def _read(self, after: int) -> tuple[np.ndarray, int, int] | None:
        """The parameters, version and superstep of a publication newer than version
        ``after``, or ``None``; into a fresh array (no state of the board is changed)."""
        w = self.window
        for _ in range(100):
            v1 = w.atomic_read(self.owner, 0)
            if v1 <= after or v1 % 2:
                if v1 % 2:
                    time.sleep(0.0001)
                    continue
                return None
            superstep = w.atomic_read(self.owner, 8)
            buf = np.empty(self.nparams, dtype=np.float32)
            view = w.local_view(self.owner)
            if view is not None:
                w.sync()
                buf[:] = view[64:64 + 4 * self.nparams].view(np.float32)
                w.sync()
            else:
                w.get(self.owner, 64, buf)
                w.flush(self.owner)
            if w.atomic_read(self.owner, 0) == v1:
                return buf, v1, superstep
        return None


#: the size :func:`agreed_model_size` gathers for a model that is not a torch module
NOT_A_MODEL = -2


def _shared(model: Any) -> list[Any]:
    """What goes to the actors: every parameter, then every floating-point buffer
    (BatchNorm's running mean and variance; not its integer batch count), in module
    order. Raises TypeError/AttributeError/RuntimeError for what has no parameters."""
    buffers = getattr(model, "buffers", None)
    return [*model.parameters(),
            *(b for b in (buffers() if callable(buffers) else ()) if b.is_floating_point())]


def _model_size(model: Any) -> tuple[int, str]:
    """(parameter and buffer values of ``model``, "") - or (-1, "") for None,
    (:data:`NOT_A_MODEL`, what it is) for something without torch parameters. Local;
    never raises."""
    if model is None:
        return -1, ""
    params = getattr(model, "parameters", None)
    if not callable(params):
        return NOT_A_MODEL, f"a {type(model).__name__}"
    try:
        return int(sum(int(p.numel()) for p in _shared(model))), ""
    except (TypeError, AttributeError, RuntimeError) as err:
        return NOT_A_MODEL, f"a {type(model).__name__} whose parameters() failed: {err}"


def model_layout(model: Any) -> int:
    """A 56-bit fingerprint of ``model``'s parameter (and floating-point buffer) shapes
    in order (0 for something without torch parameters): two models whose flat weights
    load into each other tensor for tensor have the same one. Local; never raises."""
    try:
        shapes = [tuple(int(d) for d in p.shape) for p in _shared(model)]
    except (TypeError, AttributeError, RuntimeError):
        return 0
    return int.from_bytes(hashlib.blake2b(repr(shapes).encode(), digest_size=7).digest(),
                          "little")


def flat_parameters(model: torch.nn.Module) -> np.ndarray:
    """Every parameter, then every floating-point buffer, flattened into one float32
    array (host copy; empty for a model without either)."""
    import torch

    with torch.no_grad():
        parts = [p.detach().reshape(-1).float().cpu() for p in _shared(model)]
        return torch.cat(parts).numpy() if parts else np.zeros(0, np.float32)


def load_flat(model: torch.nn.Module, flat: np.ndarray, like: Any = None) -> None:
    """Inverse of :func:`flat_parameters`. ``like``: a model of the architecture the
    weights come from (the one given to ``share_weights``); ``model`` must have its
    parameter shapes.

    Raises:
        ConfigError: ``model`` is not a torch module, has another number of parameters
            than ``flat``, or other parameter shapes than ``like`` (checked before any
            parameter is written).
    """
    import torch

    n, what = _model_size(model)
    if n != len(flat):
        got = (what or "None") if n < 0 else f"a model with {n} parameters"
        raise ConfigError(f"model: the published weights have {len(flat)} parameters; "
                          f"expected a model of that size to load them into, got {got}",
                          key="model")
    if like is not None and like is not model and model_layout(model) != model_layout(like):
        raise ConfigError(f"model: a {type(model).__name__} with the published number of "
                          f"parameters ({n}) but other parameter shapes than the shared "
                          f"model's; the weights would load into the wrong layers",
                          key="model")
    with torch.no_grad():
        o = 0
        for p in _shared(model):
            n = p.numel()
            p.copy_(torch.from_numpy(flat[o:o + n]).view_as(p))
            o += n


def agreed_model_size(world: Any, model: Any, lead: int, users: tuple[int, ...],
                      timeout_s: float = 60.0,
                      between: Callable[[], object] | None = None) -> int:
    """The lead learner's parameter count (-1 without a lead), checked against every
    rank in ``users`` (actors, learners). **Collective** on ``world`` (one Allgather,
    bounded by ``timeout_s``: a rank that never calls it raises
    :class:`~conduit_hpc.errors.CollectiveFailed` here; ``between`` runs while waiting).

    Raises:
        ConfigError: some user's model differs in size, is not a ``torch.nn.Module``, or
            the lead learner passed ``None`` while there are ranks to share with (on
            every rank: each rank's model is sized before the Allgather, so a bad one
            never leaves the others waiting in it).
    """
    n, what = _model_size(model)
    got = np.zeros((world.Get_size(), 2), dtype=np.int64)
    bounded_allgather(world, np.array([n, model_layout(model) if n >= 0 else 0],
                                      dtype=np.int64), got, timeout_s, "share_weights()",
                      between)
    sizes, layouts = got[:, 0], got[:, 1]
    if lead < 0:
        return -1
    odd = [r for r in range(len(sizes)) if sizes[r] == NOT_A_MODEL]
    if odd:
        mine = f" (this rank's: {what})" if n == NOT_A_MODEL else ""
        raise ConfigError(f"share_weights: ranks {odd} passed something that is not a "
                          f"torch.nn.Module{mine}; expected a model (or None on buffer "
                          f"ranks)", key="model")
    want = int(sizes[lead])
    if want < 0:
        raise ConfigError(f"share_weights: the lead learner (world rank {lead}) passed "
                          f"None; expected its model (a torch.nn.Module) to publish to the "
                          f"actors - or no share_weights call at all (DataPlaneReplayBuffer: "
                          f"share_weights=False)", key="model")
    bad = [r for r in users if sizes[r] != want]
    if bad:
        raise ConfigError(f"share_weights: ranks {bad} passed models with "
                          f"{[int(sizes[r]) for r in bad]} parameters, the lead learner "
                          f"{want}", key="model")
    other = [r for r in users if layouts[r] != layouts[lead]]
    if other:  # the same count, other shapes: the flat weights would load into wrong layers
        raise ConfigError(f"share_weights: ranks {other} passed models with the lead "
                          f"learner's {want} parameters but other parameter shapes (another "
                          f"architecture); expected the lead learner's", key="model")
    return want


def check_share(window: Any, learner_started: bool, world_rank: int) -> None:
    """Refuse ``share_weights()`` where it cannot run: a second time (``window``: the
    board's window from the first call; the same on every rank, so every rank that
    calls it again raises here, before any collective) or after a learner's first
    ``next_batch()``. Local.

    Raises:
        ConduitError: a second call. DataPlaneClosed: after ``next_batch()``.
    """
    if window is not None:  # before: a second window, and the first never freed
        raise ConduitError(f"share_weights() was already called on world rank "
                           f"{world_rank}; expected one call per data plane (the board it "
                           f"opened stays: actors keep pulling from it). A "
                           f"DataPlaneReplayBuffer calls it unless built with "
                           f"share_weights=False")
    if learner_started:
        raise DataPlaneClosed("share_weights() must come before the first next_batch() "
                              "(it is collective, and the data-plane thread owns MPI "
                              "from then on)")


def open_board(roles: Any, model: Any, timeout_s: float, shared: bool,
               failed: Callable[[], None]) -> tuple[RmaWindow, WeightsBoard] | None:
    """The job's weights board (``None`` when there is no learner): the lead learner's
    window, sized by the model size every actor and learner agreed on
    (:func:`agreed_model_size`). **Collective** on ``roles.world`` (a
    :class:`~conduit_hpc.plane.roles.RoleComms`), bounded by ``timeout_s``."""
    lead = roles.learner_ranks[0] if roles.learner_ranks else -1
    want = agreed_model_size(roles.world, model, lead,
                             (*roles.actor_ranks, *roles.learner_ranks), timeout_s, failed)
    if lead < 0:
        return None
    mine = 64 + 4 * want if roles.world_rank == lead else 0  # the board's bytes here
    window = RmaWindow(roles.world, mine, node_comm=roles.node, shared=shared)
    return window, WeightsBoard(window, lead, want)
