"""A learner's part in checkpoints cut at superstep boundaries (a
:class:`~conduit_hpc.plane.extensions.LearnerHook`).

At every ``every``-th boundary the learner reads its state (``provide()``: the lead
learner's model and optimizer as named arrays, counters), then - where its MPI calls are
made, behind its priority updates of the supersteps before - records the sampler's
random state and sends its marker to the buffers. When the checkpoint asks for the
part, it is handed in (at a later boundary, or when the learner stops).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from conduit_hpc.checkpoint import rng_to_json
from conduit_hpc.errors import CheckpointError
from conduit_hpc.plane.extensions import LearnerHook
from conduit_hpc.wait import Deadline

if TYPE_CHECKING:
    from conduit_hpc.plane.learner import LearnerEndpoint

__all__ = ["BoundaryHook", "frozen_arrays", "plain_counters"]


class MarkerAgent(Protocol):
    """What the hook needs of the buffer-side agent
    (:class:`~conduit_hpc.features.checkpointing.agent.CheckpointAgent`)."""

    def mark(self, superstep: int, *, part: bool = True) -> None: ...

    def contribute(self, provide: Callable[[], Mapping[str, Any]]) -> bool: ...


class BoundaryHook(LearnerHook):
    """See the module docstring.

    Args:
        agent (MarkerAgent): this rank's checkpoint agent.
        learner (LearnerEndpoint): this rank's learner endpoint.
        every (int): supersteps between boundary checkpoints (> 0).
        provide (Callable[[], dict]): this learner's state at a boundary.
    """

    def __init__(self, agent: MarkerAgent, learner: LearnerEndpoint, every: int,
                 provide: Callable[[], dict[str, Any]]) -> None:
        self.agent, self.learner = agent, learner
        self.every, self.provide = every, provide
        self._part: dict[str, Any] | None = None  # a part not yet handed in

    def on_boundary(self, superstep: int) -> None:
        self._hand_in()
        s = superstep
        if s == 0 or s % self.every or self._part is not None:
            return
        state = self.provide()
        ep = self.learner
        # plain numbers now (a 0-d array or tensor read later has changed; numpy's
        # are not JSON), in the learner's thread: see frozen_arrays for extra_state
        part: dict[str, Any] = {
            "counters": {"superstep": s + ep.superstep_offset,
                         "priority_rows": ep.priority_rows,
                         "limiter_wait_s": ep.limiter_wait_s,
                         **plain_counters(state.get("counters", {}))}}
        if "extra_state" in state:
            # frozen here, in the learner's thread: the part is written when the
            # checkpoint asks for it, supersteps later (on the data-plane thread in edp),
            # and the learner changes its parameters in place meanwhile
            try:
                part["extra_state"] = frozen_arrays(state["extra_state"])
            except CheckpointError as err:  # the checkpoint is dropped, naming it
                part["error"] = str(err)
            attrs = state.get("extra_attrs")
            part["extra_attrs"] = ({k: dict(v) if isinstance(v, Mapping) else v
                                    for k, v in attrs.items()}
                                   if isinstance(attrs, Mapping) else attrs)
        self._part = part
        agent = self.agent

        def mark() -> None:  # after this learner's updates of supersteps < s
            part["rng"] = rng_to_json(ep.sampler_rng)
            part["sampler"] = ep.sampler_state(s)  # strategy, rng, offset (schema 2)
            # updates from here on go behind the marker, which the owners hold until
            # their cut: not straight into a node-local index
            ep.updates_through_owners()
            agent.mark(s)

        ep.post(mark)

    def _hand_in(self) -> None:
        """Offer the pending part (the agent sends it once asked)."""
        part = self._part
        if part is None:
            return
        agent = self.agent

        def offer() -> None:
            if agent.contribute(lambda: part) and self._part is part:
                self._part = None

        self.learner.post(offer)

    def on_stop(self) -> None:
        # a checkpoint may still wait for this learner's part
        deadline = Deadline(self.learner.timeout_s / 4, "a checkpoint to take this part")
        while self._part is not None and not deadline.expired:  # then stop without it
            self._hand_in()
            self.learner.run_on_thread(lambda: None, "a checkpoint hand-in")
            time.sleep(0.01)


def frozen_arrays(arrays: Any) -> Any:
    """A copy of ``extra_state`` (name -> array) that nothing the caller holds can
    change: each value a numpy array of its own (a torch tensor detached and brought to
    the host first, as ``.detach().cpu().numpy()`` does). Anything else (not a mapping)
    is returned as it is, for the writer to refuse. Local.

    Raises:
        CheckpointError: a value that is not an array (naming it).
    """
    if not isinstance(arrays, Mapping):
        return arrays
    out: dict[Any, np.ndarray] = {}
    for name, value in arrays.items():
        v = value
        try:
            if callable(getattr(v, "detach", None)) and callable(getattr(v, "cpu", None)):
                v = v.detach().cpu().numpy()  # a tensor (a parameter requires grad)
            out[name] = np.array(v, copy=True)
        except (TypeError, ValueError, RuntimeError) as err:
            raise CheckpointError(f"extra state {name!r}: a {type(value).__name__} that is "
                                  f"not an array ({err}); expected numeric arrays or "
                                  f"tensors") from err
    return out


def plain_counters(counters: Any) -> Any:
    """A copy of ``counters`` (name -> number) in plain numbers, taken now: a numpy
    scalar or array, or a tensor, by its ``tolist()`` (a NaN stays a NaN: the manifest
    stores it); anything else as it is (not a mapping: returned as it is, for the part
    to refuse as before). A 0-d array counted in place would be read when the part is
    sent, and numpy's numbers are not JSON (the part's message). Local."""
    if not isinstance(counters, Mapping):
        return counters
    return {k: v.tolist() if hasattr(v, "dtype") and callable(getattr(v, "tolist", None))
            else v for k, v in counters.items()}
