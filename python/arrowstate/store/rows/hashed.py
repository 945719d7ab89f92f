"""Rows of one state partition with fixed-width keys, in memory, found through a hash table
in compiled code: a micro-batch's keys are looked up, stored and removed a whole array at a
time, never a Python object per key.

Where the keys of `KeyedRows` are Python values in a dict (one bytes object per key, and
0.3-0.45 us per dict operation in a worker's heap), these are `arrowstate.keys.key_array`'s
fixed-width keys (as the tier keeps them), and the table is pandas' (khash, the table
behind pandas' groupby and joins: 0.04 us per key looked up or stored, in C, a batch per
call). pandas' tables map 64-bit integers, so each key is reduced to one 64-bit word: the
key itself where it fits, else a hash of its bytes under a seed of this state's own. A hash
can be shared by two keys: every key found by hash is compared with the key stored for its
row, and a key whose hash another live key holds is kept in a small dict beside the table
(`_overflow`), so no key is ever taken for another. The table cannot delete: a removed
key's entry maps to -1 until the next compaction rebuilds the table from the live keys.
"""
from __future__ import annotations

import secrets
from typing import Iterator

import numpy as np
import pyarrow as pa

from ...keys import mix64, newest_of_each
from .chunks import MIN_DEAD_FOR_COMPACTION, FrozenRows, RowChunks

_U = np.uint64
_TABLE: list = []   # pandas' Int64HashTable, imported on first use (see `available`)


def available() -> bool:
    """Whether pandas' table is there with the methods used (pandas' private module: a
    pandas without them keeps keys in a dict). Imports pandas, which a worker of Spark's SQL
    operators does not otherwise load (about 36 MB and 0.35 s): called only for a state
    large enough to repay it (see VersionedState.move_to_hash_table)."""
    if not _TABLE:
        try:
            from pandas._libs.hashtable import Int64HashTable
        except ImportError:
            _TABLE.append(None)
        else:
            _TABLE.append(Int64HashTable if all(
                hasattr(Int64HashTable, m)
                for m in ("lookup", "map_locations", "map_keys_to_values", "sizeof"))
                else None)
    return _TABLE[0] is not None



class HashedRows:
    """Key -> Arrow row mapping for keys of one fixed width (`dtype`, see
    `arrowstate.keys.key_dtype`), held in memory, with KeyedRows' operations on key arrays
    (as `TieredRows` takes them)."""

    def __init__(self, schema: pa.Schema, dtype: np.dtype) -> None:
        self.schema, self.dtype = schema, np.dtype(dtype)
        # keys of 8 bytes or fewer are their own word: nothing to compare, no overflow
        self._exact = self.dtype.itemsize <= 8
        self._seed = _U(secrets.randbits(64))
        self._rows = RowChunks(schema)
        self._keys = np.empty(0, self.dtype)   # the key of each row id
        self._alive = np.empty(0, bool)        # whether each row id is its key's row
        if not available():
            raise RuntimeError("arrowstate: pandas' Int64HashTable is not there")
        self._table = _TABLE[0]()              # word -> row id (-1: removed)
        self._overflow: dict[bytes, int] = {}  # key -> row id, where another key has the word
        self._live = 0
        self._dead = 0

    def __len__(self) -> int:
        return self._live

    def close(self) -> None:
        """Nothing held outside memory."""

    def clear(self) -> None:
        self.__init__(self.schema, self.dtype)

    # -- words ------------------------------------------------------------------------------
    def _words(self, keys: np.ndarray) -> np.ndarray:
        """Each key's 64-bit word for the table (int64)."""
        if self.dtype == np.int64:
            return keys
        return words_of(keys, self._exact, self._seed)

    def _same(self, ids: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Whether the row ids' stored keys are these keys."""
        return np.ones(len(ids), bool) if self._exact else _rows_equal(self._keys[ids], keys)

    # -- keys -------------------------------------------------------------------------------
    @staticmethod
    def pick(keys: np.ndarray, positions) -> np.ndarray:
        return keys[np.asarray(positions, dtype=np.int64)]

    # -- reading ----------------------------------------------------------------------------
    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Each key's row id, -1 where the key is absent."""
        keys = np.asarray(keys, dtype=self.dtype)
        return self._find(keys, self._words(keys))

    def _find(self, keys: np.ndarray, words: np.ndarray) -> np.ndarray:
        ids = self._table.lookup(words)
        if not self._exact:
            found = np.flatnonzero(ids >= 0)
            ids[found[~self._same(ids[found], keys[found])]] = -1
        if self._overflow:
            missing = np.flatnonzero(ids < 0)
            ids[missing] = [self._overflow.get(k, -1) for k in keys[missing].tolist()]
        return ids

    def take(self, ids: np.ndarray) -> pa.RecordBatch:
        """Rows by id (from `lookup`), in the order given."""
        return self._rows.take(np.asarray(ids, dtype=np.int64))

    def keys_at(self, ids: np.ndarray) -> np.ndarray:
        """The keys of rows by id, as stored (no encoding of their columns again)."""
        return self._keys[np.asarray(ids, dtype=np.int64)]

    def live_ids(self) -> np.ndarray:
        """Every live row id, ascending."""
        return np.flatnonzero(self._alive[: self._rows.next_id])

    def first_absent(self, keys: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """Of the candidate positions, those holding the first occurrence of a key that is
        not in state, in position order."""
        if not len(candidates):
            return np.zeros(0, np.int64)
        picked = np.asarray(keys, dtype=self.dtype)[candidates]
        words = self._words(picked)
        firsts = _last_of_each(words[::-1])[::-1]
        firsts = len(picked) - 1 - firsts              # each word's first position
        if self._exact or _rows_equal(picked[firsts], picked).all():
            distinct = np.flatnonzero(firsts == np.arange(len(picked)))
        else:   # two keys of one word in the batch: find firsts by the keys themselves
            distinct = np.sort(newest_of_each(picked, first=True))
        absent = self._find(picked[distinct], words[distinct]) < 0
        return candidates[distinct[absent]]

    def items(self, batch_size: int) -> Iterator[tuple[np.ndarray, pa.RecordBatch]]:
        """Every live key with its row, a piece at a time."""
        ids = self.live_ids()
        for lo in range(0, len(ids), max(1, batch_size)):
            part = ids[lo:lo + batch_size]
            yield self._keys[part], self._rows.take(part)

    def frozen(self) -> FrozenRows:
        return self._rows.frozen(self.live_ids())

    def all_rows(self, batch_size: int) -> Iterator[pa.RecordBatch]:
        return self.frozen().batches(batch_size)

    # -- changing ---------------------------------------------------------------------------
    def insert(self, keys: np.ndarray, batch: pa.RecordBatch,
               present: np.ndarray | None = None) -> None:
        """Stores one row per key (the last of repeated keys wins); `present` is for the
        tier (the table finds replaced keys itself)."""
        n = len(keys)
        if not n:
            return
        keys = np.asarray(keys, dtype=self.dtype)
        words = self._words(keys)
        start = self._rows.append(batch)
        self._grow(self._rows.next_id)
        self._keys[start:start + n] = keys
        ids = np.arange(start, start + n, dtype=np.int64)
        last = _last_of_each(words)
        winners = np.flatnonzero(last == np.arange(n))   # the last row of each word
        self._dead += n - len(winners)   # earlier rows of a key are never its row
        slow = np.zeros(0, np.int64)
        if not self._exact:
            # rows of another key than the one whose row is their word's last: rare
            slow = np.flatnonzero(~_rows_equal(keys[last], keys))
            self._dead -= len(slow)
        previous = self._table.lookup(words[winners])
        if not self._exact or self._overflow:
            # winners whose word another live key holds, or that live in the overflow dict
            held = previous >= 0
            clash = np.zeros(len(winners), bool)
            clash[held] = ~self._same(previous[held], keys[winners[held]])
            if self._overflow:
                clash[~held] = [k in self._overflow for k in keys[winners[~held]].tolist()]
            slow = np.union1d(slow, winners[clash])
            winners, previous = winners[~clash], previous[~clash]
        replaced = previous[previous >= 0]
        self._alive[replaced] = False
        self._alive[ids[winners]] = True
        self._dead += len(replaced)
        self._live += len(winners) - len(replaced)
        self._table.map_keys_to_values(words[winners], ids[winners])
        for row in slow.tolist():   # keys sharing a word with another key: rare
            self._put_one(keys[row], int(words[row]), int(ids[row]))

    def _put_one(self, key: np.bytes_, word: int, row_id: int) -> None:
        """Stores one key whose word another key may hold, through the overflow dict."""
        held = int(self._table.lookup(np.array([word], np.int64))[0])
        name = bytes(key)
        self._alive[row_id] = True
        if held >= 0 and self._keys[held] == key:   # the key holds the word: replaced
            self._set_word(word, row_id)
            self._alive[held] = False
            self._dead += 1
        elif name in self._overflow:                # the key is in the dict: replaced
            self._alive[self._overflow[name]] = False
            self._dead += 1
            self._overflow[name] = row_id
        elif held < 0:                              # a new key, its word free
            self._set_word(word, row_id)
            self._live += 1
        else:                                       # a new key, its word another's
            self._overflow[name] = row_id
            self._live += 1

    def _set_word(self, word: int, row_id: int) -> None:
        self._table.map_keys_to_values(np.array([word], np.int64),
                                       np.array([row_id], np.int64))

    def pop_present(self, keys: np.ndarray) -> pa.RecordBatch:
        """Removes those of the keys that are present (repeats count once); returns their
        rows, in row id order."""
        keys = np.asarray(keys, dtype=self.dtype)
        ids = self.lookup(keys)
        found = np.flatnonzero(ids >= 0)
        return self.pop_found(keys[found], ids[found])

    def pop_found(self, keys: np.ndarray, ids: np.ndarray) -> pa.RecordBatch:
        """Removes keys that `lookup` found (`ids`: their row ids; repeats count once);
        returns their rows, in row id order."""
        return self._rows.take(self.remove_found(keys, ids))

    def remove_found(self, keys: np.ndarray, ids: np.ndarray,
                     key_rows: pa.RecordBatch | None = None) -> np.ndarray:
        """pop_found without reading the rows: the row ids removed, ascending (`key_rows`
        is the tier's)."""
        ids, first = np.unique(np.asarray(ids, dtype=np.int64), return_index=True)
        self._remove(np.asarray(keys, dtype=self.dtype)[first], ids)
        return ids

    def discard(self, keys: np.ndarray, key_rows: pa.RecordBatch | None = None) -> None:
        """Removes the keys, present or not, without reading their rows (`key_rows` is the
        tier's)."""
        keys = np.asarray(keys, dtype=self.dtype)
        ids = self.lookup(keys)
        found = np.flatnonzero(ids >= 0)
        ids, first = np.unique(ids[found], return_index=True)
        self._remove(keys[found][first], ids)

    def _remove(self, keys: np.ndarray, ids: np.ndarray) -> None:
        """Removes present keys (once each) whose rows are `ids`."""
        if not len(ids):
            return
        words = self._words(keys)
        if self._overflow:
            in_table = self._table.lookup(words) == ids
            for key in keys[~in_table].tolist():
                del self._overflow[key]
            words = words[in_table]
        self._table.map_keys_to_values(words, np.full(len(words), -1, np.int64))
        self._alive[ids] = False
        self._live -= len(ids)
        self._dead += len(ids)

    def compact_if_sparse(self) -> None:
        """Rewrites the live rows, and the table from their keys, once dead rows outnumber
        them: O(live)."""
        if self._dead <= max(self._live, MIN_DEAD_FOR_COMPACTION):
            return
        ids = self.live_ids()
        keys, rows = self._keys[ids], self._rows.take(ids)
        self.clear()
        for lo in range(0, len(ids), 1 << 20):
            self.insert(keys[lo:lo + (1 << 20)], rows.slice(lo, 1 << 20))

    def spill(self) -> int:
        """Held in memory only: gives nothing back."""
        return 0

    def _grow(self, size: int) -> None:
        if size <= len(self._keys):
            return
        capacity = max(size, 2 * len(self._keys), 1024)
        keys = np.empty(capacity, self.dtype)
        keys[: len(self._keys)] = self._keys
        alive = np.zeros(capacity, bool)
        alive[: len(self._alive)] = self._alive
        self._keys, self._alive = keys, alive

    # -- memory -----------------------------------------------------------------------------
    def memory_bytes(self) -> int:
        """Arrow chunks, the keys and flags by row id, the table and the overflow dict."""
        return (self._rows.nbytes() + self._keys.nbytes + self._alive.nbytes
                + self._table.sizeof() + 200 * len(self._overflow))

    def disk_bytes(self) -> int:
        return 0


def _last_of_each(words: np.ndarray) -> np.ndarray:
    """For each position, the last position holding the same word (khash, in C)."""
    table = _TABLE[0](len(words))
    table.map_locations(words)
    return table.lookup(words)


def words_of(keys: np.ndarray, exact: bool, seed: np.uint64) -> np.ndarray:
    """Fixed-width keys' 64-bit words (int64): the key itself where it fits in one
    (`exact`), else a hash of its bytes under `seed`."""
    parts = _word_columns(keys)
    if exact:
        return parts[0].view(np.int64)
    h = mix64(parts[0] ^ seed)
    for part in parts[1:]:
        h = mix64(h ^ part)
    return h.view(np.int64)


def _word_columns(keys: np.ndarray) -> list[np.ndarray]:
    """Fixed-width keys as columns of 8-byte words that together cover every byte (the
    last word overlaps the one before it where the width is not a multiple of 8; a key
    narrower than 8 bytes is one word, zero-padded)."""
    n, width = len(keys), keys.dtype.itemsize
    raw = np.ascontiguousarray(keys).view(np.uint8)
    if width < 8:
        padded = np.zeros((n, 8), np.uint8)
        padded[:, :width] = raw.reshape(n, width)
        return [padded.view(_U).ravel()]
    offsets = list(range(0, width - 7, 8))
    if offsets[-1] != width - 8:
        offsets.append(width - 8)
    if not n:
        return [np.zeros(0, _U) for _ in offsets]
    return [np.ndarray((n,), "<u8", raw, offset, (width,)) for offset in offsets]


def _rows_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Whether each pair of fixed-width keys has the same bytes (a word column at a time:
    a fraction of comparing bytes)."""
    same = np.ones(len(a), bool)
    for x, y in zip(_word_columns(a), _word_columns(b)):
        same &= x == y
    return same
