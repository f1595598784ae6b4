"""The numba kernels of :mod:`conduit_hpc.storage.tree_kernels`,
:mod:`conduit_hpc.storage.index_kernels` and :mod:`conduit_hpc.storage.frames`, defined
at module level so that numba's cache (``cache=True``, files in ``__pycache__``) holds
them across processes: defined inside a function, each kernel that calls another was a
closure, which numba compiles again in every process (~3 s of every rank's start,
measured). Imported only by :func:`conduit_hpc.storage.tree_kernels.available` (it
imports numba). Not an API: call the wrappers of those modules, which check and convert
the arguments.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def parents(p: int, idx: np.ndarray, n: int) -> np.ndarray:
    # the parents of leaves idx[:n], sorted, in a fresh array (repeats kept: fix()
    # skips them)
    par = np.empty(n, np.int64)
    ordered = True
    for i in range(n):
        par[i] = (idx[i] + p) >> 1
        if i > 0 and par[i] < par[i - 1]:
            ordered = False
    if not ordered:
        par.sort()
    return par


@numba.njit(cache=True, nogil=True)
def fix(sum_tree: np.ndarray, min_tree: np.ndarray, par: np.ndarray, do_sum: bool,
        do_min: bool) -> None:
    # recompute every touched parent from its two children, level by level from the
    # bottom, each node once per level (a contiguous range of leaves shares its
    # parents: walking each leaf to the root would redo them ~log(n) times). ``par``
    # is sorted; it is reused in place for the level above (k <= i).
    m = par.shape[0]
    while m > 0:
        k = 0
        for i in range(m):
            node = par[i]
            if node < 1 or (k > 0 and par[k - 1] == node):
                continue  # a one-leaf tree's leaf is its root; or done on this level
            if do_sum:
                sum_tree[node] = sum_tree[2 * node] + sum_tree[2 * node + 1]
            if do_min:
                a, b = min_tree[2 * node], min_tree[2 * node + 1]
                min_tree[node] = a if a <= b else b
            par[k] = node  # this level's distinct nodes, in place
            k += 1
        # the next level up: halve and drop duplicates (sorted stays sorted)
        m2 = 0
        for i in range(k):
            up = par[i] >> 1
            if up >= 1 and (m2 == 0 or par[m2 - 1] != up):
                par[m2] = up
                m2 += 1
        m = m2


@numba.njit(cache=True, nogil=True)
def fix_range(sum_tree: np.ndarray, min_tree: np.ndarray, lo: int, hi: int) -> None:
    # fix() for the parents of the contiguous nodes lo .. hi - 1 of one level (an
    # owner's commits and hides are runs of slots): each level's touched nodes are
    # again one run, so no list of them is built; the same node recomputations
    lo, hi = lo >> 1, (hi - 1) >> 1
    while lo >= 1:
        for node in range(lo, hi + 1):
            sum_tree[node] = sum_tree[2 * node] + sum_tree[2 * node + 1]
            a, b = min_tree[2 * node], min_tree[2 * node + 1]
            min_tree[node] = a if a <= b else b
        lo, hi = lo >> 1, hi >> 1


@numba.njit(cache=True, nogil=True)
def fix_slots(sum_tree: np.ndarray, min_tree: np.ndarray, slots: np.ndarray, n: int,
              run: bool) -> None:
    # both trees' parents of the leaves slots[:n] (``run``: they are slots[0],
    # slots[0] + 1, ...: fixed as one range per level)
    p = sum_tree.shape[0] // 2
    if run and p > 1:
        fix_range(sum_tree, min_tree, slots[0] + p, slots[0] + p + n)
    else:
        fix(sum_tree, min_tree, parents(p, slots, n), True, True)


@numba.njit(cache=True, nogil=True)
def sum_update(tree: np.ndarray, p: int, idx: np.ndarray, vals: np.ndarray) -> None:
    for i in range(idx.shape[0]):  # later duplicates win, as in numpy's scatter
        tree[idx[i] + p] = vals[i]
    fix(tree, tree, parents(p, idx, idx.shape[0]), True, False)


@numba.njit(cache=True, nogil=True)
def min_update(tree: np.ndarray, p: int, idx: np.ndarray, vals: np.ndarray) -> None:
    for i in range(idx.shape[0]):
        tree[idx[i] + p] = vals[i]
    fix(tree, tree, parents(p, idx, idx.shape[0]), False, True)


@numba.njit(cache=True, nogil=True)
def upper(cum: np.ndarray, x: float) -> int:
    # np.searchsorted(cum, x, side="right")
    lo, up = 0, cum.shape[0]
    while lo < up:
        mid = (lo + up) >> 1
        if cum[mid] <= x:
            lo = mid + 1
        else:
            up = mid
    return lo


@numba.njit(cache=True, nogil=True)
def last_positive(a: np.ndarray) -> int:
    # the last index with a[j] > 0 (0 if none)
    for j in range(a.shape[0] - 1, -1, -1):
        if a[j] > 0:
            return j
    return 0


@numba.njit(cache=True, nogil=True)
def search(tree: np.ndarray, targets: np.ndarray, level: int, out: np.ndarray) -> None:
    # the numpy path of sumtree.prefix_search, step for step (the same float
    # operations in the same order): the top levels through the running sums of the
    # ``level``-wide level, then one level at a time
    p = tree.shape[0] // 2
    total = tree[1]
    hi = np.nextafter(total, 0.0)
    depth = 0
    while (level << depth) < p:
        depth += 1
    n = targets.shape[0]
    if level > 1:
        masses = tree[level:2 * level].copy()
        cum = np.cumsum(masses)
        last = last_positive(masses)
    node = np.empty(n, np.int64)
    rest = np.empty(n, np.float64)
    for i in range(n):
        t = targets[i]
        t = 0.0 if t < 0.0 else (hi if t > hi else t)
        if level > 1:
            k = min(upper(cum, t), last)
            t -= cum[k] - masses[k]
            if t < 0.0:
                t = 0.0
            node[i] = k + level
        else:
            node[i] = 1
        rest[i] = t
    # one level at a time for every target (not one target at a time to its leaf):
    # a level's loads are independent, so their cache misses overlap (~30% faster
    # on a 100k-leaf tree that other work evicted from the caches). Without a branch:
    # left or right is a coin toss per level that the processor mispredicts half the
    # time; as selects (bitwise & and |, no short circuit) the descent of 256 targets
    # in a 100k-leaf tree took 10 against 27 us (bench/README.md, "Round 8"). The
    # same float steps: ``t - lv`` where the numpy path goes right, ``t`` where left.
    for _ in range(depth):
        for i in range(n):
            left = 2 * node[i]
            lv = tree[left]
            t = rest[i]
            right = ((t >= lv) & (tree[left + 1] > 0)) | (lv <= 0)
            gone = t - lv
            rest[i] = gone if right else t
            node[i] = left + np.int64(right)
    for i in range(n):
        out[i] = node[i] - p


@numba.njit(cache=True, nogil=True)
def draw(tree: np.ndarray, gens: np.ndarray, capacity: int, targets: np.ndarray,
         level: int, slots: np.ndarray, got_gens: np.ndarray, mass: np.ndarray) -> None:
    # search, then each found leaf's generation and mass; a leaf past the capacity
    # (a tree read while another process rewrote it: the caller's seqlock retries)
    # is never indexed: slot -1, generation 0, mass 0; so is a target at or past the
    # total (drawn over a total the tree has lost mass since: drawn again, never
    # clipped onto the last leaf with mass)
    search(tree, targets, level, slots)
    p = tree.shape[0] // 2
    total = tree[1]
    for i in range(slots.shape[0]):
        s = slots[i]
        if s < capacity and targets[i] < total:
            got_gens[i] = gens[s]
            mass[i] = tree[s + p]
        else:
            slots[i] = -1
            got_gens[i] = 0
            mass[i] = 0.0


@numba.njit(cache=True, nogil=True)
def index_update(sum_tree: np.ndarray, min_tree: np.ndarray, gens: np.ndarray,
                 hidden: np.ndarray, raw: np.ndarray, slots: np.ndarray,
                 ugens: np.ndarray, prios: np.ndarray, scaled: np.ndarray,
                 maxp: float) -> tuple[int, float]:
    # PriorityIndex.update, step for step: a live row (its slot still holds the
    # generation) gets the priority and its leaves (``scaled``: priority ** alpha,
    # computed by numpy, whose pow may differ from libm's in the last bit), a hidden
    # one only the raw priority; the others are dropped. Returns (dropped, new
    # running maximum), or (-1, maximum) with nothing changed where a slot lies
    # outside the index.
    p = sum_tree.shape[0] // 2
    cap = gens.shape[0]
    for i in range(slots.shape[0]):  # a slot outside the index: nothing changes
        if slots[i] < 0 or slots[i] >= cap:
            return -1, maxp
    dropped = 0
    touched = 0
    inf = np.inf
    for i in range(slots.shape[0]):
        s, g, pr = slots[i], ugens[i], prios[i]
        if g > 0 and gens[s] == g:
            raw[s] = pr
            sc = scaled[i]
            sum_tree[s + p] = sc
            min_tree[s + p] = sc if sc > 0 else inf
            slots[touched] = s  # compacted in place: the leaves whose parents change
            touched += 1
            if pr > maxp:
                maxp = pr
        elif g > 0 and hidden[s] == g:
            raw[s] = pr
            if pr > maxp:
                maxp = pr
        else:
            dropped += 1
    if touched:
        fix(sum_tree, min_tree, parents(p, slots, touched), True, True)
    return dropped, maxp


@numba.njit(cache=True, nogil=True)
def index_set(sum_tree: np.ndarray, min_tree: np.ndarray, gens: np.ndarray,
              raw: np.ndarray, slots: np.ndarray, sgens: np.ndarray, prios: np.ndarray,
              scaled: np.ndarray, keep_raw: bool) -> int:
    # PriorityIndex._set, step for step: each slot's generation, raw priority
    # (unless ``keep_raw``) and both trees' leaves (the min-tree's is inf unless the
    # row is drawable: generation > 0 and mass > 0), later duplicates winning as in
    # numpy's scatter; then one pass over the parents fixes both trees. Returns how
    # many more slots hold a generation than before (repeats counted once)
    p = sum_tree.shape[0] // 2
    inf = np.inf
    held = 0
    n = slots.shape[0]
    run = n > 0  # slots[0], slots[0] + 1, ...: one run of leaves
    for i in range(n):
        s, g, sc = slots[i], sgens[i], scaled[i]
        held += (g != 0) - (gens[s] != 0)
        gens[s] = g
        if not keep_raw:
            raw[s] = prios[i]
        sum_tree[s + p] = sc
        min_tree[s + p] = sc if (g > 0 and sc > 0) else inf
        if s != slots[0] + i:
            run = False
    if n:
        fix_slots(sum_tree, min_tree, slots, n, run)
    return held


@numba.njit(cache=True, nogil=True)
def index_hide(sum_tree: np.ndarray, min_tree: np.ndarray, gens: np.ndarray,
               hidden: np.ndarray, slots: np.ndarray, want: np.ndarray,
               check: bool) -> int:
    # PriorityIndex.hide: each slot that holds a row (generation > 0; with ``check``,
    # the generation ``want``) keeps it as hidden (its generation in ``hidden``, its
    # raw priority untouched) and is no longer drawable (generation 0, mass 0, the
    # min-tree's leaf inf); then one pass over the parents. Returns rows hidden (a
    # repeated slot once)
    p = sum_tree.shape[0] // 2
    inf = np.inf
    n = slots.shape[0]
    touched = np.empty(n, np.int64)
    k = 0
    for i in range(n):
        s = slots[i]
        g = gens[s]
        if g > 0 and (not check or g == want[i]):
            hidden[s] = g
            gens[s] = 0
            sum_tree[s + p] = 0.0
            min_tree[s + p] = inf
            touched[k] = s
            k += 1
    if k:
        run = True
        for i in range(1, k):
            if touched[i] != touched[0] + i:
                run = False
                break
        fix_slots(sum_tree, min_tree, touched, k, run)
    return k


@numba.njit(cache=True, nogil=True)
def mark(marks: np.ndarray, slots: np.ndarray, gens: np.ndarray) -> None:
    # ShardRing.mark_sampled: each drawn slot (-1: none) keeps the largest
    # generation drawn from it (a slot outside the marks is never stored to)
    n = marks.shape[0]
    for i in range(slots.shape[0]):
        s = slots[i]
        if 0 <= s < n and gens[i] > marks[s]:
            marks[s] = gens[i]


@numba.njit(cache=True, nogil=True)
def allocate(totals: np.ndarray, grand: float, rand: np.ndarray, shard: np.ndarray,
             local: np.ndarray) -> None:
    # sampling.stratified.allocate_targets after its checks, the same float steps
    # (``grand``: numpy's sum of the totals, whose pairwise order a loop would not keep)
    batch = rand.shape[0]
    cum = np.cumsum(totals)
    step = grand / batch
    last = last_positive(totals)
    for i in range(batch):
        u = (i + rand[i]) * step
        k = min(upper(cum, u), last)
        while totals[k] <= 0 and k < last:  # an empty shard: the next non-empty one
            k += 1
        shard[i] = k
        hi = np.nextafter(totals[k], 0.0)
        t = u - (cum[k] - totals[k])
        local[i] = 0.0 if t < 0.0 else (hi if t > hi else t)


@numba.njit(cache=True, nogil=True)
def check_rows(idx: np.ndarray, prios: np.ndarray, top: float, caps: np.ndarray) -> int:
    # sampling.check_update's verdict on every row in one pass: the first row whose
    # shard is not read (``caps[shard]`` <= 0 or out of the table), whose slot lies
    # outside [0, capacity), or whose priority is not in [0, top] (NaN fails), else -1
    n_caps = caps.shape[0]
    for i in range(idx.shape[0]):
        sid, s, v = idx[i, 0], idx[i, 1], prios[i]
        if sid < 0 or sid >= n_caps:
            return i
        if s < 0 or s >= caps[sid]:
            return i
        if not (v >= 0.0 and v <= top):
            return i
    return -1


@numba.njit(cache=True, nogil=True)
def span(a: np.ndarray) -> tuple[int, int]:
    # (smallest, largest) of a non-empty int64 array, any strides: one pass for what
    # a.min() and a.max() read in two numpy calls
    lo = hi = a[0]
    for i in range(1, a.shape[0]):
        v = a[i]
        if v < lo:
            lo = v
        if v > hi:
            hi = v
    return lo, hi


@numba.njit(cache=True, nogil=True)
def rows_intact(gens: np.ndarray, cursor: np.ndarray, capacity: int) -> bool:
    # ShardRing.intact(gens, cursor).all() with a cursor per row (frame stacks): each
    # row drawn (generation > 0) and ``seq + capacity >= cursor``, stopping at the
    # first that is not
    for i in range(gens.shape[0]):
        g = gens[i]
        if g <= 0 or (g - 1) + capacity < cursor[i]:
            return False
    return True


@numba.njit(cache=True, nogil=True)
def is_weights(mass: np.ndarray, pmin: float, beta: float, least: np.float32,
               out: np.ndarray) -> None:
    # sampling.stratified.importance_weights' steps, element by element: the smallest
    # positive mass drawn lowers ``pmin`` (the shards' minimum); then
    # exp(-beta * (log(p) - log(pmin))) as float32, raised to ``least`` (a NaN stays)
    drawn = np.inf
    for i in range(mass.shape[0]):
        v = mass[i]
        if v > 0 and v < drawn:
            drawn = v
    if drawn < pmin:
        pmin = drawn
    lm = np.log(pmin)
    for i in range(mass.shape[0]):
        w = np.float32(np.exp(-beta * (np.log(mass[i]) - lm)))
        out[i] = least if w < least else w


@numba.njit(cache=True, nogil=True)
def fingerprint(words: np.ndarray, mult: np.ndarray, out: np.ndarray) -> None:
    # storage.frames.fingerprints: per row, the sum of its words times ``mult``,
    # modulo 2**64 (uint64 arithmetic wraps; the order of a modular sum does not
    # change it, so this equals numpy's uint64 matmul bit for bit)
    for i in range(words.shape[0]):
        acc = np.uint64(0)
        for k in range(words.shape[1]):
            acc += np.uint64(words[i, k]) * mult[k]
        out[i] = acc


@numba.njit(cache=True, nogil=True)
def frames_differ(a: np.ndarray, b: np.ndarray, store: np.ndarray, at: np.ndarray,
                  src: np.ndarray, out: np.ndarray) -> None:
    # storage.frames.FrameWriter's byte check: whether frame ``at[j]`` of the batch
    # differs from the remembered frame ``store[src[j]]`` (src >= 0) or from the
    # batch's own frame ``-1 - src[j]`` - every word compared (no early exit: the
    # loop vectorises, and equal frames, the usual case, are read whole anyway); the
    # batch's frames are ``a`` then ``b`` (frame ``x`` is ``b[x - len(a)]`` past ``a``)
    split = a.shape[0]
    for j in range(at.shape[0]):
        x = at[j]
        fa = a[x] if x < split else b[x - split]
        s = src[j]
        if s >= 0:
            fb = store[s]
        else:
            y = -1 - s
            fb = a[y] if y < split else b[y - split]
        if fa.shape[0] == 0:  # frames of no bytes (config refuses them) are all equal
            out[j] = False
            continue
        acc = fa[0] ^ fb[0]
        for k in range(1, fa.shape[0]):
            acc |= fa[k] ^ fb[k]
        out[j] = acc != 0
