"""Balancing token workloads: k-way largest differencing (Karmarkar-Karp) with a local-search finish,
a locality-aware assignment that keeps items where they are when balance allows, and micro-batches.

Items are integers' weights (tokens of a sample, or of a whole prompt group). All functions are pure and
deterministic: ties break by item order, so every rank computes the same answer from the same inputs.
"""

import heapq
import itertools
import math
from typing import Optional, Sequence

import numpy as np


def loads_of(weights, labels, k: int) -> np.ndarray:
    return (
        np.bincount(
            np.asarray(labels, dtype=np.int64), weights=np.asarray(weights, dtype=np.float64), minlength=k
        )[:k]
        if len(weights)
        else np.zeros(k)
    )


def imbalance(loads) -> float:
    """max / mean of per-bin loads (1.0 is perfect; an empty workload counts as balanced)."""
    loads = np.asarray(loads, dtype=np.float64)
    mean = loads.mean() if loads.size else 0.0
    return float(loads.max() / mean) if mean > 0 else 1.0


def largest_differencing(weights: Sequence, k: int, pinned_loads: Optional[Sequence] = None) -> np.ndarray:
    """Karmarkar-Karp k-way partition: a bin label in [0, k) per item.

    Every item starts as a k-tuple of bins (itself and k-1 empty ones); the two tuples with the largest
    spread (max - min) merge, heaviest bin with lightest, until one tuple remains. `pinned_loads[d]` is a
    fixed load already in bin d (items kept in place); it enters as one labelled tuple, so the final bins
    carry those labels. Without it, label 0 is the heaviest bin.
    """
    heap: list = []
    tiebreak = itertools.count()

    def push(bins):  # bins: [(load, tree)] heaviest first; a tree is an item, a pinned label or a pair
        heapq.heappush(heap, (-(bins[0][0] - bins[-1][0]), next(tiebreak), bins))

    for i, w in enumerate(weights):
        push([(w, i)] + [(0, None)] * (k - 1))
    if pinned_loads is not None:
        push(sorted(((load, -1 - d) for d, load in enumerate(pinned_loads)), key=lambda b: -b[0]))
    if not heap:
        return np.zeros(0, dtype=np.int64)
    while len(heap) > 1:
        a = heapq.heappop(heap)[2]
        b = heapq.heappop(heap)[2]
        merged = [(la + lb, _join(ta, tb)) for (la, ta), (lb, tb) in zip(a, reversed(b))]
        merged.sort(key=lambda b: -b[0])
        push(merged)
    labels = np.full(len(weights), -1, dtype=np.int64)
    for j, (_, tree) in enumerate(heap[0][2]):
        leaves = _leaves(tree)
        pinned = [-1 - t for t in leaves if t < 0]
        label = pinned[0] if pinned else j
        labels[[t for t in leaves if t >= 0]] = label
    return labels


def _join(a, b):
    return b if a is None else a if b is None else (a, b)


def _leaves(tree) -> list[int]:
    out, stack = [], [tree]
    while stack:
        t = stack.pop()
        if isinstance(t, tuple):
            stack.extend(t)
        elif t is not None:
            out.append(t)
    return out


def refine(
    weights, labels: np.ndarray, k: int, base_loads=None, max_steps: int = 10_000, swaps_only: bool = False
) -> np.ndarray:
    """Local search on `labels` (in place): moves one item, or swaps two, between the heaviest bin and a
    lighter one while that lowers the heavier of the two (swaps_only: never moves one, so every bin keeps
    its item count). Each step lowers the sum of squared loads, so it
    ends; at the end no single item of the heaviest bin fits in the gap to the lightest, which bounds the
    heaviest bin by mean + largest item (plus any pinned excess in base_loads)."""
    w = np.asarray(weights, dtype=np.float64)
    loads = np.zeros(k) if base_loads is None else np.array(base_loads, dtype=np.float64)
    loads += loads_of(w, labels, k)
    for _ in range(max_steps):
        order = np.argsort(loads, kind="stable")
        heavy = order[-1]
        in_heavy = np.flatnonzero(labels == heavy)
        w_heavy = w[in_heavy]
        improved = False
        for light in order[:-1]:
            gap = loads[heavy] - loads[light]
            if gap <= 0 or not in_heavy.size:
                break
            best = _best_exchange(w, in_heavy, w_heavy, np.flatnonzero(labels == light), gap, swaps_only)
            if best is not None:
                x, y = best
                delta = w[x] - (w[y] if y is not None else 0)
                labels[x] = light
                if y is not None:
                    labels[y] = heavy
                loads[heavy] -= delta
                loads[light] += delta
                improved = True
                break
        if not improved:
            break
    return labels


def _best_exchange(w, in_heavy, w_heavy, in_light, gap, swaps_only=False):
    """The move (x, None) or swap (x, y) whose transferred weight is in (0, gap) and closest to gap / 2."""
    best, best_err = None, math.inf
    ok = (w_heavy > 0) & (w_heavy < gap) & (not swaps_only)
    if ok.any():
        cand = np.flatnonzero(ok)
        i = cand[np.argmin(np.abs(w_heavy[cand] - gap / 2))]
        best, best_err = (int(in_heavy[i]), None), abs(w_heavy[i] - gap / 2)
    if in_light.size and best_err > 0:
        order = np.argsort(w[in_light], kind="stable")
        w_light = w[in_light][order]
        targets = w_heavy - gap / 2
        pos = np.searchsorted(w_light, targets)
        for p in (np.clip(pos - 1, 0, len(w_light) - 1), np.clip(pos, 0, len(w_light) - 1)):
            delta = w_heavy - w_light[p]
            err = np.where((delta > 0) & (delta < gap), np.abs(delta - gap / 2), np.inf)
            i = int(np.argmin(err))
            if err[i] < best_err:
                best, best_err = (int(in_heavy[i]), int(in_light[order[p[i]]])), err[i]
    return best


def balanced_partition(weights, k: int) -> np.ndarray:
    """Largest differencing, then local search: a bin label per item."""
    labels = largest_differencing(np.asarray(weights).tolist(), k)
    return refine(weights, labels, k)


def balanced_assignment(weights, home, k: int, tolerance: float = 0.01) -> np.ndarray:
    """A bin per item with max/mean load <= 1 + tolerance when reachable, moving as little weight from its
    `home` bin as it can (home -1: the item has no home and always moves).

    Trade-off: balance first, locality second. Everything stays home if that is within tolerance; else
    overloaded bins shed their smallest items down to (1 - slack) x mean and the shed items, with the
    homeless ones, fill the bins by largest differencing around the kept loads. Slack grows (0, tol/4, ...)
    until the tolerance is met; if it never is, the best-balanced candidate wins, pure Karmarkar-Karp
    (bins matched to homes to keep what it can) included.
    """
    w = np.asarray(weights, dtype=np.int64)
    home = np.asarray(home, dtype=np.int64)
    if not len(w):
        return np.zeros(0, dtype=np.int64)
    mean = w.sum() / k
    if (home >= 0).all() and imbalance(loads_of(w, home, k)) <= 1 + tolerance:
        return home.copy()
    candidates = []
    for slack in [0.0] + [tolerance * f for f in (0.25, 0.5, 1, 2, 4, 8, 16, 32) if tolerance * f < 1]:
        labels = _shed_and_fill(w, home, k, cap=mean * (1 - slack))
        candidates.append(
            (imbalance(loads_of(w, labels, k)), int(w[labels != home].sum()), len(candidates), labels)
        )
        if candidates[-1][0] <= 1 + tolerance:
            return labels
    labels = _match_homes(balanced_partition(w, k), w, home, k)
    candidates.append(
        (imbalance(loads_of(w, labels, k)), int(w[labels != home].sum()), len(candidates), labels)
    )
    return min(candidates, key=lambda c: c[:3])[3]


def equal_count_assignment(weights, home, k: int, tolerance: float = 0.01) -> np.ndarray:
    """Like balanced_assignment, but every bin gets exactly len(weights) / k items (which must divide).

    Why: Megatron's data-parallel ranks each run the same number of rows per optimizer step (their
    gradients are all-reduced together), so a training layout's DP ranks need equal row counts, and
    balance can only come from which rows, not how many. Locality first: items stay home except the
    smallest of over-full bins (and homeless ones), which fill the bins with room, longest first into the
    lightest; swaps then balance. If that misses the tolerance, a fresh longest-first partition (bins
    renamed to keep weight home) is tried too and the better-balanced one wins.
    """
    w = np.asarray(weights, dtype=np.int64)
    home = np.asarray(home, dtype=np.int64)
    n = len(w)
    assert n % k == 0, f"{n} items do not split equally over {k} bins"
    cap = n // k
    labels = home.copy()
    for d in range(k):  # over-full bins keep their cap largest items
        idx = np.flatnonzero(home == d)
        if len(idx) > cap:
            smallest_first = idx[np.lexsort((idx, w[idx]))]
            labels[smallest_first[: len(idx) - cap]] = -1
    local = _fill_and_swap(w, labels, k, cap)
    if imbalance(loads_of(w, local, k)) <= 1 + tolerance:
        return local
    fresh = _fill_and_swap(w, np.full(n, -1, dtype=np.int64), k, cap)
    if (home >= 0).any():
        fresh = _match_homes(fresh, w, home, k)
    return min(
        (local, fresh), key=lambda choice: (imbalance(loads_of(w, choice, k)), int(w[choice != home].sum()))
    )


def _fill_and_swap(w, labels, k, cap):
    """Unlabelled (-1) items into the lightest bin with room, longest first; then count-keeping swaps."""
    labels = labels.copy()
    placed = labels >= 0
    loads = loads_of(w[placed], labels[placed], k)
    counts = np.bincount(labels[placed], minlength=k)[:k].astype(np.int64)
    free = np.flatnonzero(~placed)
    for i in free[np.argsort(-w[free], kind="stable")]:
        room = np.flatnonzero(counts < cap)
        b = room[np.argmin(loads[room])]
        labels[i], loads[b], counts[b] = b, loads[b] + w[i], counts[b] + 1
    return refine(w, labels, k, swaps_only=True)


def _shed_and_fill(w, home, k, cap):
    in_pool = home < 0
    pinned = np.zeros(k)
    for d in range(k):
        idx = np.flatnonzero(home == d)
        order = idx[np.lexsort((idx, w[idx]))]  # smallest first, ties by position
        cum = np.cumsum(w[order])
        load = cum[-1] if cum.size else 0
        if load > cap:
            count = min(int(np.searchsorted(cum, load - cap, side="left")) + 1, len(order))
            in_pool[order[:count]] = True
            load -= cum[count - 1]
        pinned[d] = load
    labels = home.copy()
    pool = np.flatnonzero(in_pool)
    if pool.size:
        sub = largest_differencing(w[pool].tolist(), k, pinned_loads=pinned.tolist())
        labels[pool] = refine(w[pool], sub, k, base_loads=pinned)
    return labels


def _match_homes(labels, w, home, k):
    """Renames the bins of a partition so that as much weight as possible stays home (greedy matching)."""
    at_home = np.zeros((k, k))
    has_home = home >= 0
    np.add.at(at_home, (labels[has_home], home[has_home]), w[has_home])
    rename, used = {}, set()
    for flat in np.argsort(-at_home, axis=None, kind="stable"):
        b, d = divmod(int(flat), k)
        if b not in rename and d not in used:
            rename[b] = d
            used.add(d)
    return np.array([rename[b] for b in labels], dtype=np.int64)


def micro_batches(weights, count: Optional[int] = None, max_weight: Optional[int] = None) -> list[np.ndarray]:
    """Splits items into micro-batches balanced by weight: exactly `count` of them, or the fewest (at least
    `count`) whose loads stay <= max_weight. Returns sorted item positions per micro-batch (ordered by
    their first item; empty ones, when count > items, last)."""
    w = np.asarray(weights, dtype=np.int64)
    count = max(1, count or 1)
    if max_weight is not None:
        if w.size and w.max() > max_weight:
            i = int(np.argmax(w))
            raise ValueError(f"item {i} weighs {int(w[i])} tokens, more than max_weight={max_weight}")
        count = max(count, math.ceil(w.sum() / max_weight))
    while True:
        labels = balanced_partition(w, count) if w.size else np.zeros(0, dtype=np.int64)
        if max_weight is None or loads_of(w, labels, count).max(initial=0) <= max_weight:
            break
        count += 1
    bins = [np.flatnonzero(labels == b) for b in range(count)]
    return sorted(bins, key=lambda b: (b.size == 0, b[0] if b.size else 0))
