"""Rows of one state partition, kept as Arrow and found by key in a dict.

Each put appends a record batch (a "chunk", `chunks`) of key and value columns, and a dict
maps every live key to its row's global id. Lookups and reads are Arrow `take`s, so values
never turn into Python objects and keep their exact types. Replaced and removed rows are
dead until a compaction rewrites the live ones. Also the estimates of what Python values
hold in memory (`sampled_size`).
"""
from __future__ import annotations

import collections
import itertools
import operator
import sys
from typing import Callable, Hashable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from .chunks import MIN_DEAD_FOR_COMPACTION, FrozenRows, RowChunks


class KeyedRows:
    """Key -> Arrow row mapping; keys are the hashable values of `arrowstate.keys`."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.data: dict[Hashable, int] = {}   # key -> global row id
        self._rows = RowChunks(schema)
        self._dead = 0
        self._key_bytes = 0.0
        self._sampled_at = -1   # the key count when _key_bytes was last sampled

    def __len__(self) -> int:
        return len(self.data)

    def close(self) -> None:
        """Nothing held outside memory."""

    def clear(self) -> None:
        self.data.clear()
        self._rows.clear()
        self._dead = 0

    # -- changing ---------------------------------------------------------------------------
    def insert(self, keys: Sequence[Hashable], batch: pa.RecordBatch,
               present: np.ndarray | None = None) -> None:
        """Stores one row per key (the last of repeated keys wins); `present` is for the
        tier (the dict counts replaced keys itself)."""
        before = len(self.data)
        start = self._rows.append(batch)
        self.data.update(zip(keys, range(start, start + len(keys))))
        self._dead += len(keys) - (len(self.data) - before)

    def pop_present(self, keys: Sequence[Hashable]) -> pa.RecordBatch:
        """Removes those of the keys that are present (repeats count once: a repeat finds
        its key gone); returns their rows, in row id order. One dict operation per key,
        in C, where a lookup and then a removal would take two."""
        ids = np.fromiter(map(self.data.pop, keys, itertools.repeat(-1)), dtype=np.int64,
                          count=len(keys))
        ids = np.sort(ids[ids >= 0])
        self._dead += len(ids)
        return self.take(ids)

    def pop_found(self, keys: Sequence[Hashable], ids: np.ndarray) -> pa.RecordBatch:
        """Removes keys that `lookup` found (`ids`: their row ids; repeats count once);
        returns their rows, in row id order."""
        return self.take(self.remove_found(keys, ids))

    def remove_found(self, keys: Sequence[Hashable], ids: np.ndarray,
                     key_rows: pa.RecordBatch | None = None) -> np.ndarray:
        """pop_found without reading the rows: the row ids removed, ascending (`key_rows`,
        for the tier's sake, is not needed here)."""
        ids, first = np.unique(ids, return_index=True)
        gone = self.pick(keys, first)
        collections.deque(map(self.data.__delitem__, gone), maxlen=0)  # a loop in C
        self._dead += len(ids)
        return ids

    def discard(self, keys: Sequence[Hashable], key_rows: pa.RecordBatch | None = None) -> None:
        """Removes the keys, present or not, without reading their rows (`key_rows` is the
        tier's)."""
        for k in keys:
            self.data.pop(k, None)
        self._dead += len(keys)

    def compact_if_sparse(self) -> None:
        """Rewrites the live rows into one chunk once dead rows outnumber them: O(live)."""
        if self._dead <= max(len(self.data), MIN_DEAD_FOR_COMPACTION):
            return
        ids = self.live_ids()
        order = np.argsort(ids, kind="stable")
        self._rows.keep_only(ids[order])
        new_ids = np.empty_like(ids)
        new_ids[order] = np.arange(len(ids))
        self.data = dict(zip(self.data.keys(), new_ids.tolist()))
        self._dead = 0

    def spill(self) -> int:
        """Keys held in a dict cannot leave memory: gives nothing back."""
        return 0

    # -- keys -------------------------------------------------------------------------------
    @staticmethod
    def pick(keys: Sequence[Hashable], positions) -> list:
        positions = np.asarray(positions)
        n = len(positions)
        if n > 2 and n == len(keys) and positions[0] == 0 and positions[-1] == n - 1 \
                and (np.diff(positions) == 1).all():
            return list(keys)   # every key in order (a batch with no late or repeated row)
        positions = positions.tolist()
        if len(positions) < 2:
            return [keys[i] for i in positions]
        return list(operator.itemgetter(*positions)(keys))   # gathered in C

    def first_absent(self, keys: Sequence[Hashable], candidates: np.ndarray) -> np.ndarray:
        """Of the candidate positions, those holding the first occurrence of a key that is
        not in state, in position order."""
        if not len(candidates):
            return np.zeros(0, np.int64)
        # each key's first position (the dict built backwards keeps it), then the keys not
        # in state: maps in C rather than a Python loop per row
        first = dict(zip(reversed(self.pick(keys, candidates)),
                         reversed(candidates.tolist())))
        present = np.fromiter(map(self.data.__contains__, first), bool, len(first))
        positions = np.fromiter(first.values(), np.int64, len(first))
        return np.sort(positions[~present])

    def insert_first_absent(self, keys: Sequence[Hashable], candidates: np.ndarray,
                            rows_of: Callable[[np.ndarray], pa.RecordBatch]
                            ) -> tuple[np.ndarray, list, pa.RecordBatch]:
        """`first_absent` and then `insert` of those positions' keys with their rows
        (`rows_of(positions)`), in one dict operation per candidate and one per new key
        where the two take three: each candidate claims its key with a placeholder id of its
        own (`setdefault`), and a candidate that gets its own back holds the first occurrence
        of a key not in state; those keys then get their rows' ids. Returns the positions,
        their keys and their rows."""
        picked = self.pick(keys, candidates)
        offered = np.arange(-1, -len(picked) - 1, -1)
        got = np.fromiter(map(self.data.setdefault, picked, offered.tolist()), np.int64,
                          len(picked))
        is_new = got == offered
        new_keys = self.pick(picked, np.flatnonzero(is_new))
        positions = candidates[is_new]
        try:
            rows = rows_of(positions)
            # no empty chunk (the next append would copy itself to merge it)
            start = self._rows.append(rows) if new_keys else self._rows.next_id
        except BaseException:   # no placeholder outlives the call
            collections.deque(map(self.data.__delitem__, new_keys), maxlen=0)
            raise
        self.data.update(zip(new_keys, range(start, start + len(new_keys))))
        return positions, new_keys, rows

    # -- reading ----------------------------------------------------------------------------
    def lookup(self, keys: Sequence[Hashable]) -> np.ndarray:
        """Each key's row id, -1 where the key is absent."""
        return np.fromiter(map(self.data.get, keys, itertools.repeat(-1)), dtype=np.int64,
                           count=len(keys))

    def take(self, ids: np.ndarray) -> pa.RecordBatch:
        """Rows by global id, in the order given."""
        return self._rows.take(ids)

    def live_ids(self) -> np.ndarray:
        """Every live row id, in the dict's key order."""
        return np.fromiter(self.data.values(), dtype=np.int64, count=len(self.data))

    def frozen(self) -> "FrozenRows":
        """The live rows as they are now, readable from another thread while this changes
        (chunks are immutable and the lists are copied)."""
        return self._rows.frozen(np.sort(self.live_ids()))

    def all_rows(self, batch_size: int) -> Iterator[pa.RecordBatch]:
        return self.frozen().batches(batch_size)

    def items(self, batch_size: int) -> Iterator[tuple[list, pa.RecordBatch]]:
        """Every live key with its row, a piece at a time."""
        keys = list(self.data)
        ids = self.live_ids()
        for lo in range(0, len(keys), max(1, batch_size)):
            yield keys[lo:lo + batch_size], self.take(ids[lo:lo + batch_size])

    # -- memory -----------------------------------------------------------------------------
    def memory_bytes(self) -> int:
        """Arrow chunks plus an estimate of the dict (sampled key sizes, never a full walk;
        sampled again once the key count moved by an eighth and by more than 32 keys, not at
        every task of a small state that grows)."""
        count = len(self.data)
        if self._key_bytes and abs(count - self._sampled_at) <= max(self._sampled_at // 8, 32):
            return self._rows.nbytes() + int(count * self._key_bytes)
        self._sampled_at = count
        sample = list(itertools.islice(self.data, 32))
        if sample:
            size = sum(_deep_size(k) for k in sample) / len(sample) + 100  # slot, hash, id
            self._key_bytes = size if not self._key_bytes else 0.8 * self._key_bytes + 0.2 * size
        return self._rows.nbytes() + int(len(self.data) * self._key_bytes)

    def disk_bytes(self) -> int:
        return 0


def _deep_size(v: object) -> int:
    if isinstance(v, tuple):
        return sys.getsizeof(v) + sum(_deep_size(x) for x in v)
    return sys.getsizeof(v)


def sampled_size(v: object, sample: int = 16) -> int:
    """Estimated memory of Python values held in dicts and lists (a family's own objects:
    transformWithState's variables, timer heap, TTL heaps): each container's size plus its
    length times the mean size of a sample of its items, recursively; never a full walk.
    An object that knows its size (a TimeIndex) says it."""
    if hasattr(v, "memory_bytes"):
        return v.memory_bytes()
    if isinstance(v, dict):
        items = list(itertools.islice(v.items(), sample))
        per = (sum(_deep_size(k) + sampled_size(x, sample) for k, x in items) / len(items)
               if items else 0)
        return sys.getsizeof(v) + int(len(v) * per)
    if isinstance(v, (list, tuple)) and len(v) > sample:
        step = len(v) // sample
        per = sum(sampled_size(v[i], sample) for i in range(0, step * sample, step)) / sample
        return sys.getsizeof(v) + int(len(v) * per)
    if isinstance(v, (list, tuple)):
        return sys.getsizeof(v) + sum(sampled_size(x, sample) for x in v)
    return sys.getsizeof(v)
