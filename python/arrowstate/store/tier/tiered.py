"""Rows of one state partition with fixed-width keys, in sorted runs that may live on local
disk: the tier that lets state outgrow a worker's memory budget.

A run holds keys, sorted and unique, each with its state row (Arrow) and whether it is
alive (a removal is a dead entry that hides older runs' row of that key). Runs never
change: a put or a removal adds a run, and runs merge as `schedule` plans (`merging` merges
them). Every operation is a few whole-batch numpy or Arrow calls per run, never a Python
object per key. A run is a numpy array of keys and an Arrow batch in memory, or files on
local disk (`runs`, written by `run_writer`); each has a Bloom filter (`bloom`), so a key
absent from it costs no search. The files are a cache of what the checkpoint holds: a
worker builds them from the checkpoint's files and deletes them when it drops the state or
exits.
"""
from __future__ import annotations

import itertools
import os
import shutil
import sys
import weakref
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa

from ...keys import newest_of_each
from ..rows.chunks import take_by_id
from .bloom import Bloom, key_hashes
from .merging import MERGE_ROWS, merged
from .run_writer import RunWriter
from .runs import LocalStateWriteFailed, Run, RunFiles, RunReader, empty_batch
from .schedule import MergeSchedule

_sequence = itertools.count()


@dataclass(frozen=True)
class TierPlace:
    """Where one partition's tier keeps its files, and the largest run it keeps in memory
    (`held.budget.MemoryBudget.place` decides)."""
    directory: str
    memory_cap: int

    @property
    def spills(self) -> bool:
        """Whether runs may leave memory (a worker with a budget)."""
        return self.memory_cap < sys.maxsize


class TieredRows:
    """Key -> Arrow row mapping for keys of one fixed width (`dtype`, see
    `arrowstate.keys.key_dtype`), with KeyedRows' operations on key arrays. Runs whose
    rows pass `memory_cap` bytes, and any the worker spills, live in `directory`. With
    `prefix_width`, the rows whose keys share their first bytes (Spark's prefix key: a
    session window's grouping keys) are found together (`scan_prefixes`), as Spark's
    RocksDB store finds them by prefix scan."""

    def __init__(self, schema: pa.Schema, dtype: np.dtype, directory: str,
                 memory_cap: int, prefix_width: int | None = None) -> None:
        self.schema, self.dtype = schema, np.dtype(dtype)
        # the key columns come first: VersionedState's k0, k1, ... then v0, v1, ...
        self.key_count = sum(1 for f in schema if f.name.startswith("k"))
        self.directory, self.memory_cap = directory, memory_cap
        self.prefix_width = prefix_width
        self.runs: list[Run] = []     # oldest first
        self.merges = MergeSchedule(self)
        self._live = 0
        self._made_directory = False
        self._cleanup = weakref.finalize(self, shutil.rmtree, directory, True)

    def __len__(self) -> int:
        return self._live

    def close(self) -> None:
        """Deletes the tier's files (after a merge step running in the background ends)."""
        self.merges.drop()
        self.runs = []
        self._live = 0
        self._cleanup()

    def clear(self) -> None:
        self.merges.drop()
        for run in self.runs:
            run.delete_files()
        self.runs, self._live = [], 0

    # -- keys ---------------------------------------------------------------------------
    @staticmethod
    def pick(keys: np.ndarray, positions) -> np.ndarray:
        return keys[np.asarray(positions, dtype=np.int64)]

    # -- reading ------------------------------------------------------------------------
    def _locate(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each key: the index of the newest run holding an entry of it (-1: none),
        that entry's position, and whether it is alive."""
        keys = np.asarray(keys, dtype=self.dtype)
        order = np.argsort(keys, kind="stable")
        probes = keys[order]
        hashes = key_hashes(probes, self.prefix_width)
        run_of = np.full(len(keys), -1, dtype=np.int64)
        pos = np.zeros(len(keys), dtype=np.int64)
        alive = np.zeros(len(keys), dtype=bool)
        open_ = np.arange(len(keys))
        for r in range(len(self.runs) - 1, -1, -1):
            if not len(open_):
                break
            reader = RunReader(self.runs[r], self.dtype)
            try:
                found, at, live = reader.find(probes[open_], hashes[open_])
            finally:
                reader.close()
            hit = open_[found]
            run_of[order[hit]] = r
            pos[order[hit]] = at[found]
            alive[order[hit]] = live[found]
            open_ = open_[~found]
        return run_of, pos, alive

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Each key's row id (valid until the rows change), -1 where it is absent."""
        run_of, pos, alive = self._locate(keys)
        starts = np.cumsum([0] + [r.n for r in self.runs], dtype=np.int64)
        return np.where(alive, starts[np.maximum(run_of, 0)] + pos, -1)

    def take(self, ids: np.ndarray) -> pa.RecordBatch:
        """Rows by id (from `lookup`), in the order given."""
        def rows_at(r: int, positions: np.ndarray) -> pa.RecordBatch:
            reader = RunReader(self.runs[r], self.dtype)
            try:
                return reader.rows_at(positions)
            finally:
                reader.close()

        starts = np.cumsum([0] + [r.n for r in self.runs[:-1]], dtype=np.int64)
        rows = take_by_id(self.schema, starts, np.asarray(ids, dtype=np.int64), rows_at)
        return pa.RecordBatch.from_arrays(rows.columns, schema=self.schema)

    def scan_prefixes(self, prefixes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The live rows whose keys start with one of the prefixes (fixed-width bytes of
        `prefix_width`, unique): each row's prefix (its index in `prefixes`) and row id
        (valid until the rows change), in key order."""
        none = np.zeros(0, np.int64)
        if not len(prefixes) or not self.runs:
            return none, none
        order = np.argsort(prefixes, kind="stable")
        ordered = prefixes[order]
        lows = _padded(ordered, self.dtype, 0)
        highs = _padded(ordered, self.dtype, 0xFF)
        hashes = key_hashes(ordered)
        starts = np.cumsum([0] + [r.n for r in self.runs], dtype=np.int64)
        owners, ids, keys, ages, alive = [], [], [], [], []
        for r, run in enumerate(self.runs):
            reader = RunReader(run, self.dtype)
            try:
                owner, pos, key, live = reader.scan(lows, highs, hashes)
                if len(pos):
                    owners.append(owner)
                    ids.append(starts[r] + pos)
                    keys.append(key)
                    alive.append(live)
                    ages.append(np.full(len(pos), len(self.runs) - r))
            finally:
                reader.close()
        if not ids:
            return none, none
        owner, id_, key, age, live = (np.concatenate(x) for x in (owners, ids, keys, ages,
                                                                  alive))
        pick = np.lexsort((age, key))            # each key's newest entry first
        newest = np.ones(len(pick), dtype=bool)
        newest[1:] = key[pick][1:] != key[pick][:-1]
        pick = pick[newest]
        pick = pick[live[pick]]
        return order[owner[pick]], id_[pick]

    def first_absent(self, keys: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """Of the candidate positions, those holding the first occurrence of a key that is
        not in state, in position order."""
        if not len(candidates):
            return candidates
        picked = keys[candidates]
        distinct = newest_of_each(picked, first=True)
        absent = self.lookup(picked[distinct]) < 0
        return np.sort(candidates[distinct[absent]])

    def items(self, batch_size: int) -> Iterator[tuple[np.ndarray, pa.RecordBatch]]:
        """Every live key with its row, in key order, a piece at a time."""
        frozen = self.frozen()
        yield from frozen.items(batch_size)

    def frozen(self) -> "FrozenTier":
        """The live rows as they are now, readable from another thread while this changes
        (runs never change, and their files are held open)."""
        return FrozenTier(self.schema, self.dtype, list(self.runs), self._live)

    def all_rows(self, batch_size: int) -> Iterator[pa.RecordBatch]:
        return self.frozen().batches(batch_size)

    # -- changing -----------------------------------------------------------------------
    def insert(self, keys: np.ndarray, batch: pa.RecordBatch,
               present: np.ndarray | None = None) -> None:
        """Stores one row per key (the last of repeated keys wins). `present`: whether
        each key is stored already, where the caller knows (spares a lookup)."""
        if not len(keys):
            return
        keys = np.asarray(keys, dtype=self.dtype)
        pick = newest_of_each(keys)
        keys = keys[pick]
        present = self.lookup(keys) >= 0 if present is None else present[pick]
        self._live += int(len(keys) - present.sum())
        in_place = len(pick) == batch.num_rows and not np.any(pick != np.arange(len(pick)))
        rows = batch if in_place else batch.take(pa.array(pick))
        self._add(Run.in_memory(keys, None, pa.RecordBatch.from_arrays(
            rows.columns, schema=self.schema), self.prefix_width))

    def pop_present(self, keys: np.ndarray) -> pa.RecordBatch:
        """Removes those of the keys that are present (repeats count once); returns their rows."""
        keys = np.asarray(keys, dtype=self.dtype)
        ids = self.lookup(keys)
        found = np.flatnonzero(ids >= 0)
        return self.pop_found(keys[found], ids[found])

    def pop_found(self, keys: np.ndarray, ids: np.ndarray) -> pa.RecordBatch:
        """Removes keys that `lookup` found (`ids`: their row ids; repeats count once);
        returns their rows."""
        keys = np.asarray(keys, dtype=self.dtype)
        once = newest_of_each(ids)   # in row-id order
        rows = self.take(ids[once])   # before the removal: it changes the row ids
        self._bury(keys[once], rows)
        return rows

    def remove_found(self, keys: np.ndarray, ids: np.ndarray,
                     key_rows: pa.RecordBatch) -> np.ndarray:
        """pop_found without reading the rows (`key_rows`: rows whose first columns are
        the keys', one per id): the row ids removed, ascending (as they were: the removal
        changes them)."""
        keys = np.asarray(keys, dtype=self.dtype)
        once = newest_of_each(ids)
        self._bury(keys[once], key_rows.take(pa.array(once)))
        return ids[once]

    def discard(self, keys: np.ndarray, key_rows: pa.RecordBatch) -> None:
        """Removes the keys, present or not, without reading their rows (`key_rows`: rows
        whose first columns are the keys', one per key)."""
        if not len(keys) or not self.runs:
            return
        keys = np.asarray(keys, dtype=self.dtype)
        pick = newest_of_each(keys)
        pick = pick[self.lookup(keys[pick]) >= 0]
        self._bury(keys[pick], key_rows.take(pa.array(pick)))

    def _bury(self, keys: np.ndarray, key_rows: pa.RecordBatch) -> None:
        """Removes present keys (unique; `key_rows`: rows whose first columns are theirs, in
        the same order): a run of dead entries that hides them. Each keeps its key columns
        (the checkpoint's copy of a run names the keys it removes), its values null."""
        if not len(keys):
            return
        self._live -= len(keys)
        order = np.argsort(keys, kind="stable")
        key_rows = key_rows.take(pa.array(order))
        columns = key_rows.columns[: self.key_count] + [
            pa.nulls(len(keys), f.type) for f in list(self.schema)[self.key_count:]]
        self._add(Run.in_memory(keys[order], np.zeros(len(keys), dtype=bool),
                                pa.RecordBatch.from_arrays(columns, schema=self.schema),
                                self.prefix_width))

    def _add(self, run: Run) -> None:
        """Appends a run, then merges runs as `schedule` plans; the newest goes to disk when
        it passes the memory cap."""
        self.merges.collect(wait=False)
        self.runs.append(run)
        self.merges.added(run.n)
        newest = self.runs[-1]
        if (not newest.on_disk and newest.memory_bytes() > self.memory_cap
                and id(newest) not in self.merges.merging_runs()):
            self.runs[-1] = self._write(newest)

    def merge_runs(self, runs: list[Run], bottom: bool) -> Run:
        """One run from several (oldest first). Dead entries are dropped at the bottom (no
        older run left to hide). The result goes to disk when any input is there or its
        rows would pass the memory cap."""
        to_disk = (any(r.on_disk for r in runs)
                   or sum(r.memory_bytes() for r in runs) > self.memory_cap)
        readers = [RunReader(r, self.dtype) for r in runs]
        try:
            pieces = merged(readers, MERGE_ROWS, keep_dead=not bottom)
            if to_disk:
                result = self._write_pieces(pieces, sum(r.n for r in runs))
            else:
                parts = list(pieces)
                if parts:
                    keys = np.concatenate([k for k, _, _ in parts])
                    alive = np.concatenate([a for _, a, _ in parts])
                    rows = pa.concat_batches([r for _, _, r in parts])
                else:
                    keys, alive = np.zeros(0, self.dtype), np.zeros(0, bool)
                    rows = empty_batch(self.schema)
                result = Run.in_memory(keys, alive, rows, self.prefix_width)
        finally:
            for reader in readers:
                reader.close()
        for run in runs:
            run.delete_files()
        return result

    def _write(self, run: Run) -> Run:
        """The run on disk (the same entries: its run files in the checkpoint serve)."""
        reader = RunReader(run, self.dtype)
        try:
            written = self._write_pieces(
                iter([(reader.keys(0, run.n), reader.alive(0, run.n), reader.rows(0, run.n))]
                     if run.n else []), run.n, run.bloom)
        finally:
            reader.close()
        written.files = run.files
        return written

    def adopt(self, entries: Iterator[tuple[np.ndarray, np.ndarray, pa.RecordBatch]],
              expected: int, pieces: tuple, bad: Callable[[str], Exception]) -> None:
        """Appends, as the newest run and on disk, a run read back from the checkpoint (its
        run files `pieces`; `entries`: (keys, alive, rows) in key order, `expected` of
        them); nothing merges (the runs were merged as they were written). A key out of
        order is `bad(what)`: the files were written under other key seeds, or damaged."""
        writer = self.run_writer(expected)
        last = None
        try:
            for keys, alive, rows in entries:
                if len(keys) and ((last is not None and not keys[0] > last)
                                  or np.any(keys[1:] <= keys[:-1])):
                    raise bad("its keys are not in the order of the keys' hash seeds its "
                              "snapshot names")
                if len(keys):
                    last = keys[-1]
                writer.write(keys, alive, rows)
            run = writer.finish(self.dtype)
        except BaseException:
            writer.abandon()
            raise
        run.files = RunFiles(pieces)
        self.runs.append(run)

    def set_live(self, count: int) -> None:
        """The live rows of runs adopted (a snapshot records them)."""
        self._live = count

    def _write_pieces(self, pieces, expected: int, bloom: Bloom | None = None) -> Run:
        writer = self.run_writer(expected, bloom)
        try:
            for keys, alive, rows in pieces:
                writer.write(keys, alive, rows)
            return writer.finish(self.dtype)
        except BaseException:
            writer.abandon()
            raise

    def run_writer(self, expected: int, bloom: Bloom | None = None) -> RunWriter:
        """A writer of a new run in the tier's directory (made when first needed)."""
        if not self._made_directory:
            try:
                os.makedirs(self.directory, exist_ok=True)
            except OSError as e:
                raise LocalStateWriteFailed(self.directory, e) from e
            self._made_directory = True
        return RunWriter(os.path.join(self.directory, str(next(_sequence))), self.schema,
                         expected, bloom, self.prefix_width)

    def spill(self) -> int:
        """Writes every run held in memory to disk; the bytes of memory it gives back."""
        freed = 0
        merging = self.merges.merging_runs()
        for i, run in enumerate(self.runs):
            if not run.on_disk and run.n and id(run) not in merging:
                freed += run.memory_bytes()
                self.runs[i] = self._write(run)
        return freed

    def compact_if_sparse(self) -> None:
        """Runs merge as they are added; after a commit, the paced merges done are swapped
        in and the next step of the others begins."""
        self.merges.step()

    # -- memory -------------------------------------------------------------------------
    def memory_bytes(self) -> int:
        return sum(r.memory_bytes() for r in self.runs)

    def disk_bytes(self) -> int:
        return sum(r.disk_bytes for r in self.runs)


def _padded(prefixes: np.ndarray, dtype: np.dtype, fill: int) -> np.ndarray:
    """Prefixes padded with `fill` bytes to keys of `dtype`: the lowest or highest key
    with each prefix."""
    width = prefixes.dtype.itemsize
    raw = np.full((len(prefixes), dtype.itemsize), fill, dtype=np.uint8)
    raw[:, :width] = np.ascontiguousarray(prefixes).view(np.uint8).reshape(-1, width)
    return raw.view(dtype).ravel()


class FrozenTier:
    """A consistent view of the live rows at one moment, in key order."""

    def __init__(self, schema: pa.Schema, dtype: np.dtype, runs: list[Run],
                 live: int) -> None:
        self.schema, self.dtype, self.live = schema, dtype, live
        # files are opened now: a merge may delete them before the view is read
        self._readers = [RunReader(r, dtype) for r in runs]

    def runs(self) -> list[tuple[Run, RunReader]]:
        """Its runs, oldest first, each with a reader of it (closed with the view)."""
        return [(reader.run, reader) for reader in self._readers]

    def __del__(self) -> None:
        self.close()

    def close(self) -> None:
        readers, self._readers = self._readers, []
        for reader in readers:
            reader.close()

    def items(self, batch_size: int) -> Iterator[tuple[np.ndarray, pa.RecordBatch]]:
        try:
            for keys, _, rows in merged(self._readers, max(1, min(batch_size, MERGE_ROWS)),
                                        keep_dead=False):
                rows = pa.RecordBatch.from_arrays(rows.columns, schema=self.schema)
                for lo in range(0, len(keys), max(1, batch_size)):
                    yield keys[lo:lo + batch_size], rows.slice(lo, batch_size)
        finally:
            self.close()

    def batches(self, batch_size: int) -> Iterator[pa.RecordBatch]:
        for _, rows in self.items(batch_size):
            yield rows
