"""Rows of one state partition in the compiled hash table (`HashedRows`) whose rows of one
key prefix are also found together (`scan_prefixes`), as the tier's sorted runs find them:
for a state held in memory whose family looks its rows up by a prefix of their key
(session windows: a grouping key's sessions, the prefix, each stored under the grouping key
and its start).

The prefix index: entries of (prefix word, row id), the word being the prefix's bytes as a
64-bit word where they fit, else their hash (as `HashedRows` makes a key's word), kept in
two numpy arrays sorted by word: a large one and a recent one. Rows stored wait beside them
and join the recent level in one merge at the next scan (a family stores a task's rows at
its end and scans in the next task's restore); the recent level joins the large one once
it holds a quarter as many entries, so a merge copies the whole index only that often (each
entry about five times over its life, not once a task). Removed and replaced rows leave
their entries behind, which a scan passes over (their row ids are no longer alive) and a
merge drops. A prefix word can be shared by two prefixes: where the prefix is hashed, every
row found is compared with the prefix it was found for.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from ...keys import prefixes as key_prefixes
from .hashed import HashedRows, _rows_equal, words_of


class PrefixedHashedRows(HashedRows):
    """`HashedRows` of keys of `dtype` whose first `prefix_width` bytes are a prefix that
    `scan_prefixes` finds rows by."""

    def __init__(self, schema: pa.Schema, dtype: np.dtype, prefix_width: int) -> None:
        super().__init__(schema, dtype)
        self.prefix_width = prefix_width
        self._prefix_dtype = np.dtype(f"S{prefix_width}")
        self._prefix_exact = prefix_width <= 8
        # (words, ids) sorted by word: the large level, the recent level
        self._levels = [(np.zeros(0, np.int64), np.zeros(0, np.int64))] * 2
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []   # (words, ids), unsorted

    def clear(self) -> None:
        self.__init__(self.schema, self.dtype, self.prefix_width)

    def _prefix_words(self, prefixes: np.ndarray) -> np.ndarray:
        return words_of(prefixes, self._prefix_exact, self._seed)

    def insert(self, keys: np.ndarray, batch: pa.RecordBatch,
               present: np.ndarray | None = None) -> None:
        start = self._rows.next_id
        keys = np.asarray(keys, dtype=self.dtype)
        super().insert(keys, batch, present)
        if len(keys):   # every row stored gets an entry: ids start, start + 1, ...
            self._pending.append((self._prefix_words(key_prefixes(keys, self.prefix_width)),
                                  np.arange(start, start + len(keys), dtype=np.int64)))

    def _merged(self, parts: list[tuple[np.ndarray, np.ndarray]]
                ) -> tuple[np.ndarray, np.ndarray]:
        """Entries of these parts whose rows are alive, sorted by word."""
        ids = np.concatenate([i for _, i in parts])
        live = self._alive[ids]
        words, ids = np.concatenate([w for w, _ in parts])[live], ids[live]
        order = np.argsort(words, kind="stable")   # sorted parts are runs: merged
        return words[order], ids[order]

    def _merge_pending(self) -> None:
        """The waiting entries into the recent level, and that into the large level once it
        holds a quarter as many."""
        if not self._pending:
            return
        large, recent = self._levels
        recent = self._merged([recent] + self._pending)
        self._pending = []
        if len(recent[0]) * 4 >= len(large[0]):
            large, recent = self._merged([large, recent]), (recent[0][:0], recent[1][:0])
        self._levels = [large, recent]

    def scan_prefixes(self, prefixes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The live rows whose keys start with one of the prefixes (fixed-width bytes of
        `prefix_width`, unique): each row's prefix (its index in `prefixes`) and row id
        (valid until the rows change), in no particular order."""
        none = np.zeros(0, np.int64)
        if not len(prefixes) or not self._live:
            return none, none
        self._merge_pending()
        prefixes = np.asarray(prefixes, dtype=self._prefix_dtype)
        words = self._prefix_words(prefixes)
        owners, ids = [], []
        for level_words, level_ids in self._levels:
            lows = np.searchsorted(level_words, words, "left")
            counts = np.searchsorted(level_words, words, "right") - lows
            total = int(counts.sum())
            if total:
                # each prefix's entries lows[i] ... lows[i] + counts[i] - 1, in one array
                firsts = np.cumsum(counts) - counts
                owners.append(np.repeat(np.arange(len(prefixes), dtype=np.int64), counts))
                ids.append(level_ids[np.arange(total) + np.repeat(lows - firsts, counts)])
        if not ids:
            return none, none
        owner, ids = np.concatenate(owners), np.concatenate(ids)
        keep = self._alive[ids]
        if not self._prefix_exact:
            keep &= _rows_equal(key_prefixes(self._keys[ids], self.prefix_width),
                                prefixes[owner])
        return owner[keep], ids[keep]

    def memory_bytes(self) -> int:
        return super().memory_bytes() + sum(w.nbytes + i.nbytes
                                            for w, i in self._levels + self._pending)
