"""What TorchRL's replay buffers offer that :class:`~conduit_hpc.integrations.torchrl.
DataPlaneReplayBuffer` refuses, each with why and what to use instead.

A script moved from ``TensorDictPrioritizedReplayBuffer`` may still call these; an
``AttributeError`` would not say that the data plane does it another way.
"""

from __future__ import annotations

from typing import Any, NoReturn

from conduit_hpc.errors import ConduitError

__all__ = ["NotOnTheDataPlane", "TorchRLRefusals"]

_STATE = ("the replay lives in MPI shared windows on the buffer ranks, not in this "
          "process: checkpoint it with the job's [checkpoint] section (or "
          "conduit_hpc.features.checkpointing.save_checkpoint, collective) and restore it "
          "with `conduit-hpc run ... --resume` (restore_data_plane)")


class NotOnTheDataPlane(ConduitError, NotImplementedError):
    """A TorchRL replay-buffer method the data plane's buffer does not offer (the
    message says why and what to use instead)."""


def _refuse(what: str, why: str) -> NoReturn:
    raise NotOnTheDataPlane(f"DataPlaneReplayBuffer.{what} is not offered: {why}")


class TorchRLRefusals:
    """TorchRL ``ReplayBuffer`` methods refused by name (a mixin)."""

    def state_dict(self) -> NoReturn:
        _refuse("state_dict()", _STATE)

    def load_state_dict(self, state_dict: Any) -> NoReturn:
        _refuse("load_state_dict()", _STATE)

    def dumps(self, path: Any) -> NoReturn:
        _refuse("dumps()", _STATE)

    def loads(self, path: Any) -> NoReturn:
        _refuse("loads()", _STATE)

    def empty(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse("empty()", "every rank of the job shares the replay; rows leave it as the "
                           "actors' writes lap its rings (storage.capacity_rows)")

    def __getitem__(self, index: Any) -> NoReturn:
        _refuse("__getitem__", "rows are read by sample() (or iteration); they live on "
                               "the buffer ranks and are overwritten as the actors write, "
                               "so there is no stable position to index")
