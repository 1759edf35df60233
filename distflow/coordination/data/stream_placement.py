"""Where a batch that moves in parts goes among the consumer's data-parallel ranks, decided part by part.

A batch streamed to a training layout (rollout.stream_chunks: dag/streaming.py) moves while it is still
being generated, so no plan sees it whole. Each part's plan places its new items (prompt groups, or samples)
on the DP rank with the fewest items so far, the lightest by tokens among those (heaviest item first), and
remembers it; every later plan of the same batch keeps what was placed, and the final transfer of the whole
batch places the items no part carried the same way. Counts then never differ by more than one between DP
ranks, so a batch whose item count the DP size divides ends with equal counts, which a training layout needs
(balance.equal_count_assignment says why); token balance is the greedy's, not Karmarkar-Karp's.

Pure and deterministic (ties break by item key): every rank runs the same plans over the same all-gathered
metadata in the same order and holds the same placement.
"""

from typing import Optional

import numpy as np


class StreamPlacement:
    """The DP rank of every item of one streamed batch placed so far, and the per-rank counts and tokens."""

    def __init__(self, dp: int, keep_groups: bool):
        # keep_groups: the items are prompt groups, else samples (a plan of the other kind ignores this)
        self.dp, self.keep_groups = dp, keep_groups
        self.dp_of: dict[int, int] = {}
        self.counts = np.zeros(dp, dtype=np.int64)
        self.tokens = np.zeros(dp, dtype=np.int64)

    def assign(self, keys, weights) -> np.ndarray:
        """A DP rank per item (keys: group ids or sample ids; weights: their tokens): the placed keep theirs,
        the new are placed and remembered."""
        keys = np.asarray(keys, dtype=np.int64)
        weights = np.asarray(weights, dtype=np.int64)
        out = np.array([self.dp_of.get(int(k), -1) for k in keys.tolist()], dtype=np.int64)
        new = np.flatnonzero(out < 0)
        for i in new[np.lexsort((keys[new], -weights[new]))].tolist():
            d = int(np.lexsort((np.arange(self.dp), self.tokens, self.counts))[0])
            out[i] = self.dp_of[int(keys[i])] = d
            self.counts[d] += 1
            self.tokens[d] += int(weights[i])
        return out

    def equal_counts(self, keys) -> Optional[np.ndarray]:
        """The placed DP ranks of `keys` when every key is placed and each DP rank has as many of them, else
        None (a part's groups were later dropped, e.g. by dynamic sampling: the caller plans afresh)."""
        placed = [self.dp_of.get(int(k), -1) for k in np.asarray(keys).tolist()]
        if min(placed, default=0) < 0:
            return None
        counts = np.bincount(np.asarray(placed, dtype=np.int64), minlength=self.dp)
        return np.asarray(placed, dtype=np.int64) if len(set(counts.tolist())) == 1 else None
