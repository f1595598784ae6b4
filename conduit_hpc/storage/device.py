"""The ``learner_gpu`` tier: rows in a learner's device memory, with a device-side
priority index. Torch (imported here, not by ``conduit_hpc.storage``); no MPI, no NCCL.

A :class:`DeviceStore` keeps every spec column as one tensor ``[capacity, *shape]`` on a
torch device (``cuda:i`` on a GPU node; ``cpu`` in the tests and on this machine), the
row ids, raw priorities and masses ``priority ** alpha`` as device tensors, and the
cumulative masses (float64, rebuilt lazily after a change). Drawing is exact
prioritized sampling: a target ``t`` in ``[0, total)`` selects the first slot whose
cumulative mass exceeds ``t`` (``torch.searchsorted``, right side), so slot ``i`` is drawn
for targets in ``[C[i-1], C[i])``, a set of measure ``mass[i]`` - empty slots (mass 0)
never. :meth:`sample`, :meth:`gather`, :meth:`update` and :meth:`draw_batch` stay on
the device: random targets from a device generator, ``searchsorted``, ``index_select``,
``index_copy_`` - no host round trip. Rows enter (:meth:`insert`) from host arrays or
device tensors, and leave for a move (:meth:`take`) as host arrays; both choose free
slots on the host (one small copy), which is where a move is decided anyway.

Several updates of one slot in one call: the last one wins, on every device (each is
written with the last one's value: ``index_copy_`` with repeated indices keeps any one of
them on a GPU).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from conduit_hpc.spec import Spec

__all__ = ["DeviceStore", "device_dtype", "host_view"]


class DeviceStore:
    """Rows of the ``learner_gpu`` tier on one torch device (see the module docstring).

    Args:
        spec (Spec): the experience schema.
        capacity (int): slots.
        alpha (float): priority exponent (0: uniform over held rows).
        device (str | torch.device): where rows live (``cuda:0``, ``cpu``).
        seed (int): seed of the device generator used by :meth:`sample`.
        tier (str): the tier's name.
    """

    def __init__(self, spec: Spec, capacity: int, *, alpha: float = 1.0,
                 device: str | torch.device = "cpu", seed: int = 0,
                 tier: str = "learner_gpu") -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.spec, self.capacity, self.alpha, self.tier = spec, int(capacity), float(alpha), tier
        d = torch.device(device)
        if d.type == "cuda" and d.index is None:  # the device tensors land on: "cuda"
            d = torch.device("cuda", torch.cuda.current_device())  # != "cuda:0"
        self.device = d
        self.columns = {f.name: torch.zeros((self.capacity, *f.shape),
                                            dtype=_torch_dtype(f.dtype), device=d)
                        for f in spec}
        self.ids = torch.full((self.capacity,), -1, dtype=torch.int64, device=d)
        self.prio = torch.zeros(self.capacity, dtype=torch.float64, device=d)
        self.mass = torch.zeros(self.capacity, dtype=torch.float64, device=d)
        self._cum: torch.Tensor | None = None
        self._massive = torch.zeros(self.capacity, dtype=torch.int64, device=d)  # search
        # kept up to date slot by slot (O(rows changed)): held flags and count, and each
        # slot's mass where it can be drawn (inf elsewhere) for the minimum
        self._flag = torch.zeros(self.capacity, dtype=torch.int8, device=d)
        self._held = 0
        self._drawable = torch.full((self.capacity,), float("inf"), dtype=torch.float64,
                                    device=d)
        self.generator = torch.Generator(device=d)
        self.generator.manual_seed(int(seed))

    # -- conversions ---------------------------------------------------------------
    def from_host(self, x: Any) -> torch.Tensor:
        return torch.as_tensor(np.asarray(x), device=self.device)

    @staticmethod
    def to_host(x: Any) -> np.ndarray:
        return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)

    def _scaled(self, p: torch.Tensor) -> torch.Tensor:
        if self.alpha == 1:
            return p
        return torch.where(p > 0, torch.pow(p, self.alpha), torch.zeros_like(p))

    def _changed(self, slots: torch.Tensor, *, held_same: bool = False) -> None:
        """``slots`` changed (rows, ids or masses): the cumulative masses are rebuilt at
        the next draw; the held count and drawable masses are refreshed there."""
        self._cum = None
        s = torch.unique(slots)
        now = self.ids.index_select(0, s) >= 0
        if not held_same:  # one scalar read back
            self._held += int((now.to(torch.int64) - self._flag.index_select(0, s)).sum())
            self._flag.index_copy_(0, s, now.to(torch.int8))
        m = self.mass.index_select(0, s)
        self._drawable.index_copy_(0, s, torch.where(now & (m > 0), m,
                                                     torch.full_like(m, float("inf"))))

    def cumulative(self) -> torch.Tensor:
        """Cumulative masses over the slots (device, float64), never decreasing.

        On a GPU ``cumsum`` is a parallel scan: neighbouring sums are added in different
        orders, so they need not be sorted, and a slot of mass 0 can end one ulp above
        the slot before it (a draw could land on it). The sums are made monotone here,
        and :meth:`search` moves a draw that lands on a slot of mass 0 to the nearest
        slot with mass (found reading the code after the first GPU run; not seen
        there)."""
        if self._cum is None:
            self._cum = torch.cummax(torch.cumsum(self.mass, 0), 0).values
            idx = torch.arange(self.capacity, device=self.device)
            has = self.mass > 0
            nxt = torch.where(has, idx, self.capacity).flip(0).cummin(0).values.flip(0)
            prv = torch.where(has, idx, -1).cummax(0).values.clamp_(min=0)
            self._massive = torch.where(nxt < self.capacity, nxt, prv)
        return self._cum

    # -- the interface (TierStore) -------------------------------------------------
    def held(self) -> int:
        return self._held

    def free(self) -> int:
        return self.capacity - self.held()

    def total(self) -> float:
        return float(self.cumulative()[-1].item())

    def total_tensor(self) -> torch.Tensor:
        """The total mass as a device scalar (no host synchronisation)."""
        return self.cumulative()[-1]

    def insert(self, rows: Mapping[str, Any], ids: Any, priorities: Any) -> torch.Tensor:
        ids_t = torch.as_tensor(np.asarray(ids) if not isinstance(ids, torch.Tensor) else ids,
                                dtype=torch.int64, device=self.device).reshape(-1)
        n = int(ids_t.numel())
        free = torch.nonzero(self.ids < 0).reshape(-1)
        if n > len(free):
            raise ValueError(f"{self.tier}: {n} rows do not fit in {len(free)} free slots")
        slots = free[:n]
        for f in self.spec:
            t = _tensor(rows[f.name])
            self.columns[f.name].index_copy_(0, slots, t.to(self.device).reshape(
                n, *f.shape).to(self.columns[f.name].dtype))
        p = torch.as_tensor(np.asarray(priorities, np.float64) if not isinstance(
            priorities, torch.Tensor) else priorities, dtype=torch.float64,
            device=self.device).reshape(-1)
        self.ids.index_copy_(0, slots, ids_t)
        self.prio.index_copy_(0, slots, p)
        self.mass.index_copy_(0, slots, self._scaled(p))
        self._changed(slots)
        return slots

    def put(self, slots: Any, rows: Mapping[str, Any], ids: Any, masses: Any) -> None:
        """Rows at given ``slots`` (replacing what they held), each with its mass
        ``priority ** alpha`` as another index computed it (a mirror of a ring, slot for
        slot: :class:`~conduit_hpc.plane.device_tier.DeviceShard`). The priority kept is
        ``mass ** (1 / alpha)`` (1 when ``alpha`` is 0)."""
        s = torch.as_tensor(np.asarray(slots, np.int64), device=self.device).reshape(-1)
        n = int(s.numel())
        if n == 0:
            return
        keep = _winners(s, self.capacity)  # a slot given twice: the last wins, anywhere
        for f in self.spec:
            t = _tensor(rows[f.name])
            self.columns[f.name].index_copy_(0, s, t.to(self.device).reshape(
                n, *f.shape).index_select(0, keep).to(self.columns[f.name].dtype))
        m = torch.as_tensor(np.asarray(masses, np.float64),
                            device=self.device).reshape(-1).index_select(0, keep)
        p = torch.pow(m, 1.0 / self.alpha) if self.alpha > 0 else torch.ones_like(m)
        self.ids.index_copy_(0, s, torch.as_tensor(np.asarray(ids, np.int64),
                                                   device=self.device).reshape(-1)
                             .index_select(0, keep))
        self.prio.index_copy_(0, s, p)
        self.mass.index_copy_(0, s, m)
        self._changed(s)

    def evict_ids_below(self, limit: int, slots: Any) -> int:
        """Drop the rows held at ``slots`` whose id is below ``limit`` (a ring's rows of
        an older lap); returns how many. On the device; one scalar read back."""
        s = torch.as_tensor(np.asarray(slots, np.int64), device=self.device).reshape(-1)
        ids = self.ids.index_select(0, s)
        s = s[(ids >= 0) & (ids < int(limit))]
        n = int(s.numel())
        if n:
            self._clear(s)
        return n

    def _clear(self, s: torch.Tensor) -> None:
        """Slots ``s`` hold nothing from now on."""
        self.ids.index_fill_(0, s, -1)
        self.prio.index_fill_(0, s, 0.0)
        self.mass.index_fill_(0, s, 0.0)
        self._changed(s)

    def min_mass(self) -> float:
        """Smallest mass of a drawable row (held, mass > 0; ``inf`` when none), as the
        host index's min-tree gives it."""
        return float(self.min_tensor().item())

    def min_tensor(self) -> torch.Tensor:
        """:meth:`min_mass` as a device scalar (no host synchronisation)."""
        return self._drawable.min()

    def search(self, targets: Any) -> torch.Tensor:
        t = torch.as_tensor(targets, dtype=torch.float64, device=self.device)
        cum = self.cumulative()
        found = torch.searchsorted(cum, t, right=True).clamp_(max=self.capacity - 1)
        return self._massive.index_select(0, found)  # a slot of mass 0: its neighbour

    def sample(self, k: int) -> torch.Tensor:
        """``k`` slots, stratified over the total mass, drawn on the device."""
        total = self.total_tensor()
        u = torch.rand(k, dtype=torch.float64, device=self.device, generator=self.generator)
        targets = (torch.arange(k, dtype=torch.float64, device=self.device) + u) * (total / k)
        return self.search(torch.minimum(targets, torch.nextafter(total, total.new_zeros(()))))

    def gather(self, slots: Any) -> dict[str, torch.Tensor]:
        s = torch.as_tensor(slots, dtype=torch.int64, device=self.device)
        return {name: col.index_select(0, s) for name, col in self.columns.items()}

    def draw_batch(self, k: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor],
                                          torch.Tensor]:
        """Sample and gather on the device: slots, ids, columns and each row's draw
        probability (``mass / total``), all device tensors."""
        slots = self.sample(k)
        return (slots, self.ids.index_select(0, slots), self.gather(slots),
                self.mass.index_select(0, slots) / self.total_tensor())

    def ids_at(self, slots: Any) -> torch.Tensor:
        return self.ids.index_select(0, torch.as_tensor(slots, dtype=torch.int64,
                                                         device=self.device))

    def priorities(self, slots: Any) -> torch.Tensor:
        return self.prio.index_select(0, torch.as_tensor(slots, dtype=torch.int64,
                                                          device=self.device))

    def masses(self, slots: Any) -> torch.Tensor:
        return self.mass.index_select(0, torch.as_tensor(slots, dtype=torch.int64,
                                                          device=self.device))

    def update(self, slots: Any, ids: Any, priorities: Any) -> torch.Tensor:
        """Where ``slots`` still hold ``ids``, set the priorities; on the device (no
        host synchronisation). Returns the applied mask (device)."""
        s = torch.as_tensor(slots, dtype=torch.int64, device=self.device).reshape(-1)
        i = torch.as_tensor(ids, dtype=torch.int64, device=self.device).reshape(-1)
        p = torch.as_tensor(priorities, dtype=torch.float64, device=self.device).reshape(-1)
        live = (self.ids.index_select(0, s) == i) & (i >= 0)
        # the last live update of each slot (a row drawn twice in a batch gets two), as
        # the host index applies them in order; index_copy_ alone would keep any one on
        # a GPU (seen on an H200: the first of two)
        win = _winners(s, self.capacity, live)
        new = torch.where(win >= 0, p.index_select(0, win.clamp(min=0)),
                          self.prio.index_select(0, s))
        self.prio.index_copy_(0, s, new)
        self.mass.index_copy_(0, s, self._scaled(new))
        self._changed(s, held_same=True)
        return live

    def take(self, slots: Any) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        s = torch.as_tensor(np.asarray(slots, np.int64), device=self.device).reshape(-1)
        held = self.ids.index_select(0, s) >= 0
        s = s[held]
        rows = {f.name: host_view(v, f.dtype) for f, v in zip(
            self.spec, self.gather(s).values(), strict=True)}
        ids = self.to_host(self.ids.index_select(0, s))
        prio = self.to_host(self.prio.index_select(0, s))
        self._clear(s)
        return rows, ids, prio

    def held_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        s = torch.nonzero(self.ids >= 0).reshape(-1)
        return (self.to_host(s), self.to_host(self.ids.index_select(0, s)),
                self.to_host(self.prio.index_select(0, s)))


def _torch_dtype(dt: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype=device_dtype(dt))).dtype


def device_dtype(dt: np.dtype) -> np.dtype:
    """The numpy dtype a column is kept as on the device: the signed type of the same
    width for ``uint16/32/64`` (torch has few kernels for them; the bits are kept, and
    :func:`host_view` / a ``Tensor.view`` gives the unsigned values back)."""
    dt = np.dtype(dt)
    return np.dtype(f"i{dt.itemsize}") if dt.kind == "u" and dt.itemsize > 1 else dt


def _winners(s: torch.Tensor, capacity: int, where: torch.Tensor | None = None
             ) -> torch.Tensor:
    """For each position of ``s`` (slots in ``[0, capacity)``), the position of the last
    occurrence of its slot (of those where ``where`` holds; -1: none), on ``s``'s device
    with no host synchronisation: ``index_copy_`` with repeated indices keeps any one of
    them on a GPU, so every occurrence is given the last one's value (the last wins, as
    in order). ``scatter_reduce`` with ``amax`` gives the same in any order."""
    pos = torch.arange(len(s), device=s.device)
    if where is not None:
        pos = torch.where(where, pos, -1)
    last = torch.full((capacity,), -1, dtype=torch.int64, device=s.device)
    return last.scatter_reduce_(0, s, pos, reduce="amax").index_select(0, s)


def host_view(x: torch.Tensor, dt: np.dtype) -> np.ndarray:
    """A device column's rows as host numpy of the spec's dtype ``dt``."""
    return x.detach().cpu().numpy().view(np.dtype(dt))


#: torch's wide unsigned types -> the signed type a device column keeps (device_dtype)
_SIGNED = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}


def _tensor(src: Any) -> torch.Tensor:
    """Rows (numpy or torch) as a tensor of the device column's dtype family."""
    if isinstance(src, torch.Tensor):
        return src.view(_SIGNED[src.dtype]) if src.dtype in _SIGNED else src
    arr = np.ascontiguousarray(src)
    return torch.from_numpy(arr.view(device_dtype(arr.dtype)))
