"""TorchRL's own prioritized buffer where its C++ extension does not load.

TorchRL's ``PrioritizedSampler`` (behind ``TensorDictPrioritizedReplayBuffer``) keeps its
priorities in segment trees from TorchRL's C++ extension (``torchrl._torchrl``), which a
wheel builds against one torch version; with another torch the extension fails to load
(an undefined symbol) and the buffer raises ``RuntimeError: SumSegmentTreeFp32 is not
available`` when it is built. :func:`extension_problem` detects that (the same test as
``conduit-hpc bench peers``) and says what to do.

:func:`torchrl_prioritized_buffer` builds TorchRL's own buffer: its
``TensorDictPrioritizedReplayBuffer`` where the extension loads, else TorchRL's
``TensorDictReplayBuffer`` with :func:`fallback_sampler_class` - TorchRL's
``PrioritizedSampler`` itself (its sampling, importance weights and priority updates)
with the two trees replaced by numpy ones (:mod:`conduit_hpc.storage.sumtree`). The
single-process baseline of ``conduit-hpc bench torchrl`` and the ``plain`` mode of the
TorchRL job use it. It is slower than the C++ trees; results say which one ran.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from conduit_hpc.storage.sumtree import MinTree, SumTree

__all__ = ["NumpyMinSegmentTree", "NumpySumSegmentTree",
           "TorchRLExtensionWarning", "extension_problem", "fallback_sampler_class",
           "torchrl_prioritized_buffer"]


class TorchRLExtensionWarning(UserWarning):
    """TorchRL's C++ extension does not load with the installed torch."""


def extension_problem() -> str | None:
    """Why TorchRL's C++ segment trees cannot be used here, with the fix; ``None`` when
    they load. Local; imports ``torchrl._torchrl``."""
    try:
        from torchrl._torchrl import SumSegmentTreeFp32  # noqa: F401
    except ImportError as err:
        import torchrl

        why = ("undefined symbols: built against another torch"
               if "undefined symbol" in str(err) else str(err)[:160])
        return (f"TorchRL {torchrl.__version__}'s C++ extension (torchrl._torchrl, its "
                f"segment trees) does not load with torch {torch.__version__} ({why}): "
                f"TorchRL's own TensorDictPrioritizedReplayBuffer cannot be built. The "
                f"data-plane buffer (conduit_hpc.integrations.torchrl) does not need it; "
                f"TorchRL's own prioritized buffer falls back to numpy trees "
                f"(torchrl_prioritized_buffer). To fix it, install the torch that this "
                f"torchrl release was built for, or build torchrl against this torch "
                f"(pip install --no-build-isolation --no-binary torchrl "
                f"torchrl=={torchrl.__version__})")
    return None


class _NumpySegmentTree:
    """The interface of TorchRL's C++ segment trees that ``PrioritizedSampler`` uses
    (``[]``, ``[] =``, ``query``, ``scan_lower_bound``), on a numpy tree."""

    def __init__(self, tree: Any) -> None:
        self.tree = tree

    def __getitem__(self, index: Any) -> np.ndarray:
        return self.tree[torch.as_tensor(index).cpu().numpy()]

    def __setitem__(self, index: Any, value: Any) -> None:
        idx = torch.as_tensor(index).cpu().numpy().reshape(-1)
        val = torch.as_tensor(value, dtype=torch.float64).cpu().numpy()
        self.tree.update(idx, np.broadcast_to(val.reshape(-1) if val.ndim else val,
                                              idx.shape))

    def __len__(self) -> int:
        return int(self.tree.capacity)


class NumpySumSegmentTree(_NumpySegmentTree):
    """``SumSegmentTreeFp64`` on :class:`~conduit_hpc.storage.sumtree.SumTree`."""

    def __init__(self, capacity: int) -> None:
        super().__init__(SumTree(capacity))

    def query(self, start: int, end: int) -> float:
        """Sum of leaves ``[start, end)`` (unfilled leaves hold 0)."""
        if start == 0 and end >= 0:
            return float(self.tree.total) if end >= self.tree.capacity else float(
                self.tree.leaves[:end].sum())
        return float(self.tree.leaves[start:end].sum())

    def scan_lower_bound(self, mass: Any) -> np.ndarray:
        """The leaf each prefix mass falls in (never a zero leaf)."""
        m = np.asarray(torch.as_tensor(mass, dtype=torch.float64).cpu().numpy())
        m = np.minimum(m.reshape(-1), np.nextafter(self.tree.total, 0.0))
        return self.tree.prefix_search(m)


class NumpyMinSegmentTree(_NumpySegmentTree):
    """``MinSegmentTreeFp64`` on :class:`~conduit_hpc.storage.sumtree.MinTree`."""

    def __init__(self, capacity: int) -> None:
        super().__init__(MinTree(capacity))

    def query(self, start: int, end: int) -> float:
        """Minimum of leaves ``[start, end)`` (unfilled leaves hold +inf)."""
        if start == 0 and end >= self.tree.capacity:
            return float(self.tree.min)
        return float(self.tree.leaves[start:end].min())


def fallback_sampler_class() -> type:
    """TorchRL's ``PrioritizedSampler`` with numpy trees (a class made on first use, as
    it imports TorchRL)."""
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler

    class FallbackSampler(PrioritizedSampler):
        """TorchRL's ``PrioritizedSampler`` on numpy trees (see the module docstring)."""

        def _init(self) -> None:
            self._sum_tree = NumpySumSegmentTree(self._max_capacity)
            self._min_tree = NumpyMinSegmentTree(self._max_capacity)
            self._max_priority = None

    return FallbackSampler


def torchrl_prioritized_buffer(capacity: int, *, alpha: float, beta: float,
                               batch_size: int, priority_key: str = "td_error",
                               eps: float = 1e-8) -> tuple[Any, str]:
    """TorchRL's own prioritized TensorDict buffer on a ``LazyTensorStorage``.

    Returns:
        tuple: the buffer, and which trees it runs on: ``"c++"`` (TorchRL's
        ``TensorDictPrioritizedReplayBuffer``) or ``"numpy"`` (the fallback, see the
        module docstring).
    """
    from torchrl.data import (
        LazyTensorStorage,
        TensorDictPrioritizedReplayBuffer,
        TensorDictReplayBuffer,
    )

    if extension_problem() is None:
        return TensorDictPrioritizedReplayBuffer(
            alpha=alpha, beta=beta, eps=eps, priority_key=priority_key,
            storage=LazyTensorStorage(capacity), batch_size=batch_size), "c++"
    sampler = fallback_sampler_class()(capacity, alpha=alpha, beta=beta, eps=eps)
    return TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler,
                                  priority_key=priority_key, batch_size=batch_size), "numpy"
