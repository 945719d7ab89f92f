"""Keys ordered by the time they expire, so eviction and timeouts touch only what expires."""
from __future__ import annotations

import heapq
import itertools
from typing import Hashable, Sequence

import numpy as np


class TimeIndex:
    """Keys arrive a batch at a time: each batch becomes a bucket sorted by time (one numpy
    argsort), and a heap orders the buckets by their earliest time. An entry is never
    updated in place: a key whose time changes gets a new entry, and an entry whose key was
    removed or moved is skipped when it comes up.
    """

    def __init__(self) -> None:
        self._buckets: list[tuple[int, int, "_Bucket"]] = []
        self._seq = itertools.count()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def add_many(self, times: np.ndarray, keys: Sequence[Hashable],
                 valid: np.ndarray | None = None) -> None:
        """Adds each key at its time; with `valid`, only where it is true (a key without a
        time never expires)."""
        if valid is not None:
            times = np.asarray(times)[valid]
            keys = list(itertools.compress(keys, valid.tolist()))
        if len(keys) == 0:
            return
        order = np.argsort(times, kind="stable")
        bucket = _Bucket(np.asarray(times)[order], [keys[i] for i in order.tolist()])
        heapq.heappush(self._buckets, (int(bucket.times[0]), next(self._seq), bucket))
        self._size += len(keys)

    def pop_until(self, threshold: int) -> tuple[list, np.ndarray]:
        """Takes out every entry at or below threshold: their keys and times. Entries of keys
        since removed, or whose time moved, are among them: the caller checks."""
        keys, times = [], []
        buckets = self._buckets
        while buckets and buckets[0][0] <= threshold:
            _, seq, bucket = heapq.heappop(buckets)
            cut = int(np.searchsorted(bucket.times, threshold, side="right"))
            keys += bucket.keys[bucket.start:cut]
            times.append(bucket.times[bucket.start:cut])
            self._size -= cut - bucket.start
            bucket.start = cut
            if cut < len(bucket.keys):
                heapq.heappush(buckets, (int(bucket.times[cut]), seq, bucket))
        return keys, (np.concatenate(times) if times else np.zeros(0, dtype=np.int64))

    def memory_bytes(self) -> int:
        return self._size * 72


class _Bucket:
    __slots__ = ("times", "keys", "start")

    def __init__(self, times: np.ndarray, keys: list) -> None:
        self.times, self.keys, self.start = times, keys, 0
