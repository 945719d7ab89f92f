"""Keys ordered by the time they expire, so eviction and timeouts touch only what expires."""
from __future__ import annotations

import heapq
import itertools
from typing import Hashable, Sequence

import numpy as np

from ..rows.keyed import KeyedRows


class TimeIndex:
    """Keys arrive a batch at a time: each batch becomes a bucket sorted by time (one numpy
    argsort), and a heap orders the buckets by their earliest time. An entry is never
    updated in place: a key whose time changes gets a new entry, and an entry whose key was
    removed or moved is skipped when it comes up. Keys come as a list of Python values or
    as a numpy array (a store that keeps keys in arrays); buckets keep the form given.
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
        as_array = isinstance(keys, np.ndarray)
        if valid is not None and not valid.all():
            times = np.asarray(times)[valid]
            keys = keys[valid] if as_array else list(itertools.compress(keys, valid.tolist()))
        if len(keys) == 0:
            return
        order = np.argsort(times, kind="stable")
        bucket = _Bucket(np.asarray(times)[order],
                         keys[order] if as_array else KeyedRows.pick(keys, order))
        heapq.heappush(self._buckets, (int(bucket.times[0]), next(self._seq), bucket))
        self._size += len(keys)

    def pop_until(self, threshold: int) -> tuple[list | np.ndarray, np.ndarray]:
        """Takes out every entry at or below threshold: their keys (a list, or an array where
        keys came as arrays) and times. Entries of keys since removed, or whose time moved,
        are among them: the caller checks."""
        keys, times, arrays = [], [], []
        buckets = self._buckets
        while buckets and buckets[0][0] <= threshold:
            _, seq, bucket = heapq.heappop(buckets)
            cut = int(np.searchsorted(bucket.times, threshold, side="right"))
            if isinstance(bucket.keys, np.ndarray):
                arrays.append(bucket.keys[bucket.start:cut])
            else:
                keys += bucket.keys[bucket.start:cut]
            times.append(bucket.times[bucket.start:cut])
            self._size -= cut - bucket.start
            bucket.start = cut
            if cut < len(bucket.keys):
                heapq.heappush(buckets, (int(bucket.times[cut]), seq, bucket))
        if arrays:
            keys = np.concatenate(arrays)
        return keys, (np.concatenate(times) if times else np.zeros(0, dtype=np.int64))

    def memory_bytes(self) -> int:
        """8 bytes a time, and a key: its array's item, or about 64 bytes as a Python value
        in a list (the key object itself is shared with the store's dict)."""
        total = 0
        for _, _, bucket in self._buckets:
            live = len(bucket.keys) - bucket.start
            key = (bucket.keys.itemsize if isinstance(bucket.keys, np.ndarray) else 64)
            total += live * (8 + key)
        return total


class _Bucket:
    __slots__ = ("times", "keys", "start")

    def __init__(self, times: np.ndarray, keys: list) -> None:
        self.times, self.keys, self.start = times, keys, 0
