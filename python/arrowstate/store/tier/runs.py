"""Sorted runs of a partition's state (see `tiered`): a run in memory or its files on disk,
and reading it (`RunReader`); writing one is `run_writer`'s, merging them `merging`'s.

A run on disk is three files in the tier's directory, read with ordinary reads, never
mapped, so the worker's resident memory holds only what an operation reads and the
kernel's page cache holds the rest:

    <n>.keys    the keys' fixed-width bytes, sorted
    <n>.alive   one byte per key (no file when every entry is alive)
    <n>.arrow   an Arrow IPC file of the rows, one record batch per block of BLOCK keys

The first key of each block stays in memory (`fences`), so finding keys reads only the
blocks they fall in.
"""
from __future__ import annotations

import contextlib
import errno
import os

import numpy as np
import pyarrow as pa

from ...errors import ArrowStateError
from .bloom import BLOOM_MIN_KEYS, Bloom, BloomBuilder

BLOCK = 4096              # keys per block of a run on disk (one Arrow record batch each)
SPAN_BLOCKS = 256         # the most blocks of keys one lookup reads at once (1M keys)
# probes that many times fewer than the keys or more are merged with them, not searched
_MERGE_SEARCH_RATIO = 8
DIR_SETTING = "spark.arrowstate.worker.localDir"


class LocalStateWriteFailed(ArrowStateError):
    """The tier, or a large state file received, could not be written to local disk (a full
    disk, a missing or read-only directory)."""

    def __init__(self, path: str, error: OSError,
                 written: str = "state that is over the worker's memory budget") -> None:
        full = error.errno in (errno.ENOSPC, errno.EDQUOT)
        what = ("the local disk is full" if full
                else f"{type(error).__name__}: {error.strerror or error}")
        super().__init__(
            "ARROWSTATE_LOCAL_STATE_WRITE_FAILED",
            f"arrowstate could not write {written} to {path}: {what}. Nothing committed is "
            f"lost (the checkpoint holds it); free space there, or point {DIR_SETTING} "
            "(default: Spark's local directories) at a disk with room, or give the workers "
            "more memory.",
            path=path, reason=what, setting=DIR_SETTING)


class RunFiles:
    """A run's files in the checkpoint (`manifest.Piece`s), None until a snapshot that wrote
    them has shipped; one cell for the run and its copies (a run moved to disk is the same
    run), so a snapshot marks it without holding the run itself."""

    __slots__ = ("pieces",)

    def __init__(self, pieces: tuple | None = None) -> None:
        self.pieces = pieces


class Run:
    """One run: in memory (`keys`, `alive`, `rows`) or on disk (`path`, `fences`), and the
    Bloom filter of its keys."""

    __slots__ = ("n", "keys", "alive", "rows", "path", "fences", "has_dead", "disk_bytes",
                 "bloom", "files", "__weakref__")

    def __init__(self, n: int) -> None:
        self.n = n
        self.keys: np.ndarray | None = None
        self.alive: np.ndarray | None = None     # None: every entry alive
        self.rows: pa.RecordBatch | None = None
        self.path: str | None = None
        self.fences: np.ndarray | None = None
        self.has_dead = False
        self.disk_bytes = 0
        self.bloom: Bloom | None = None
        # its run files in the checkpoint (`manifest`), shared with its copies
        self.files: RunFiles | None = None

    @classmethod
    def in_memory(cls, keys: np.ndarray, alive: np.ndarray | None,
                  rows: pa.RecordBatch, prefix_width: int | None = None) -> "Run":
        """`prefix_width`: the Bloom filter's, see `bloom`."""
        run = cls(len(keys))
        run.keys, run.rows = keys, rows
        if len(keys) >= BLOOM_MIN_KEYS:
            builder = BloomBuilder(len(keys), prefix_width)
            builder.add(keys)
            run.bloom = builder.finish(keys.dtype)
        if alive is not None and not alive.all():
            run.alive, run.has_dead = alive, True
        return run

    @property
    def pieces(self) -> tuple | None:
        """Its run files in the checkpoint, once a snapshot that wrote them has shipped."""
        return self.files.pieces if self.files is not None else None

    @property
    def on_disk(self) -> bool:
        return self.path is not None

    def memory_bytes(self) -> int:
        bloom = self.bloom.nbytes if self.bloom is not None else 0
        if self.on_disk:
            return self.fences.nbytes + bloom
        return (bloom + self.keys.nbytes + self.rows.nbytes
                + (self.alive.nbytes if self.alive is not None else 0))

    def delete_files(self) -> None:
        if self.path is not None:
            delete_run_files(self.path)


class RunReader:
    """Reads a run (its files held open, so a merge that deletes them meanwhile does not
    disturb a reader that started before)."""

    def __init__(self, run: Run, dtype: np.dtype) -> None:
        self.run, self.dtype = run, dtype
        if run.on_disk:
            self._keys = os.open(run.path + ".keys", os.O_RDONLY)
            self._alive = (os.open(run.path + ".alive", os.O_RDONLY) if run.has_dead
                           else None)
            self._arrow_file = pa.OSFile(run.path + ".arrow", "rb")
            self._arrow = pa.ipc.open_file(self._arrow_file)

    def close(self) -> None:
        if self.run.on_disk:
            os.close(self._keys)
            if self._alive is not None:
                os.close(self._alive)
            self._arrow_file.close()

    def keys(self, lo: int, hi: int) -> np.ndarray:
        if not self.run.on_disk:
            return self.run.keys[lo:hi]
        size = self.dtype.itemsize
        return np.frombuffer(_pread(self._keys, (hi - lo) * size, lo * size), self.dtype)

    def alive(self, lo: int, hi: int) -> np.ndarray:
        if not self.run.has_dead:
            return np.ones(hi - lo, dtype=bool)
        if not self.run.on_disk:
            return self.run.alive[lo:hi]
        return np.frombuffer(_pread(self._alive, hi - lo, lo), dtype=bool)

    def rows(self, lo: int, hi: int) -> pa.RecordBatch:
        if not self.run.on_disk:
            return self.run.rows.slice(lo, hi - lo)
        first, last = lo // BLOCK, (hi - 1) // BLOCK
        parts = [self._arrow.get_batch(b) for b in range(first, last + 1)]
        whole = parts[0] if len(parts) == 1 else pa.concat_batches(parts)
        return whole.slice(lo - first * BLOCK, hi - lo)

    def rows_at(self, positions: np.ndarray) -> pa.RecordBatch:
        """Rows at sorted positions."""
        if not self.run.on_disk:
            return self.run.rows.take(pa.array(positions))
        blocks = positions // BLOCK
        cuts = np.flatnonzero(np.diff(blocks)) + 1
        parts = []
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(positions)]):
            b = int(blocks[lo])
            parts.append(self._arrow.get_batch(b).take(pa.array(positions[lo:hi] - b * BLOCK)))
        return parts[0] if len(parts) == 1 else pa.concat_batches(parts)

    def find(self, probes: np.ndarray, hashes: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For sorted probes (and their key_hashes): found, position, alive (the last two
        meaningful where found). Only probes the run's Bloom filter may hold are searched."""
        run = self.run
        found = np.zeros(len(probes), dtype=bool)
        pos = np.zeros(len(probes), dtype=np.int64)
        alive = np.ones(len(probes), dtype=bool)
        if run.n == 0 or len(probes) == 0:
            return found, pos, alive
        if run.bloom is not None:
            maybe = np.flatnonzero(run.bloom.may_hold(probes, hashes))
            if len(maybe) < len(probes):
                found[maybe], pos[maybe], alive[maybe] = self._search_run(probes[maybe])
                return found, pos, alive
        return self._search_run(probes)

    def scan(self, lows: np.ndarray, highs: np.ndarray, hashes: np.ndarray | None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The entries in key ranges [lows[i], highs[i]] (sorted, not overlapping; `hashes`,
        their prefixes' key_hashes when the run's Bloom filter is by prefix): each entry's
        range, position, key and whether it is alive, in key order."""
        run = self.run
        none = np.zeros(0, np.int64)
        if run.n == 0 or len(lows) == 0:
            return none, none, np.zeros(0, self.dtype), np.zeros(0, bool)
        which = np.arange(len(lows))
        if run.bloom is not None and hashes is not None:
            which = np.flatnonzero(run.bloom.may_hold(lows, hashes, highs))
            lows, highs = lows[which], highs[which]
        owners, positions, found, alive = [], [], [], []

        def within(keys: np.ndarray, offset: int, p0: int, p1: int) -> None:
            a = np.searchsorted(keys, lows[p0:p1], side="left")
            b = np.searchsorted(keys, highs[p0:p1], side="right")
            counts = b - a
            total = int(counts.sum())
            if total:
                owners.append(np.repeat(which[p0:p1], counts))
                local = np.repeat(a - np.cumsum(counts) + counts, counts) + np.arange(total)
                positions.append(offset + local)
                found.append(keys[local])
                alive.append(self.alive(offset, offset + len(keys))[local])

        if not run.on_disk:
            within(run.keys, 0, 0, len(lows))
        else:
            first = np.maximum(np.searchsorted(run.fences, lows, side="right") - 1, 0)
            last = np.searchsorted(run.fences, highs, side="right") - 1
            # the blocks the ranges touch, read a span of consecutive blocks at a time
            covered = np.zeros(len(run.fences) + 1, np.int64)
            inside = last >= 0
            np.add.at(covered, first[inside], 1)
            np.add.at(covered, last[inside] + 1, -1)
            touched = np.flatnonzero(np.cumsum(covered)[:-1] > 0)
            breaks = np.flatnonzero((np.diff(touched) != 1)
                                    | (np.arange(1, len(touched)) % SPAN_BLOCKS == 0)) + 1
            for lo_i, hi_i in zip(np.r_[0, breaks], np.r_[breaks, len(touched)]):
                if lo_i == hi_i:
                    continue
                b0, b1 = int(touched[lo_i]), int(touched[hi_i - 1]) + 1
                # the ranges that overlap these blocks (first and last rise with the ranges)
                p0 = int(np.searchsorted(last, b0, side="left"))
                p1 = int(np.searchsorted(first, b1, side="left"))
                if p0 < p1:
                    lo, hi = b0 * BLOCK, min(b1 * BLOCK, run.n)
                    within(self.keys(lo, hi), lo, p0, p1)
        if not owners:
            return none, none, np.zeros(0, self.dtype), np.zeros(0, bool)
        return tuple(np.concatenate(x) for x in (owners, positions, found, alive))

    def _search_run(self, probes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """find() over every probe."""
        run = self.run
        found = np.zeros(len(probes), dtype=bool)
        pos = np.zeros(len(probes), dtype=np.int64)
        alive = np.ones(len(probes), dtype=bool)
        if not len(probes):
            return found, pos, alive
        if not run.on_disk:
            _search(run.keys, probes, found, pos)
            if run.has_dead:
                alive[found] = run.alive[pos[found]]
            return found, pos, alive
        block = np.searchsorted(run.fences, probes, side="right") - 1
        start = int(np.searchsorted(block, 0))            # probes below the first key miss
        if start == len(probes):
            return found, pos, alive
        tail = block[start:]
        touched = tail[np.r_[True, tail[1:] != tail[:-1]]]
        # runs of consecutive touched blocks, each read at once (at most SPAN_BLOCKS)
        breaks = np.flatnonzero((np.diff(touched) != 1)
                                | (np.arange(1, len(touched)) % SPAN_BLOCKS == 0)) + 1
        for lo_i, hi_i in zip(np.r_[0, breaks], np.r_[breaks, len(touched)]):
            b0, b1 = int(touched[lo_i]), int(touched[hi_i - 1]) + 1
            p0 = int(np.searchsorted(block, b0))
            p1 = int(np.searchsorted(block, b1))
            lo, hi = b0 * BLOCK, min(b1 * BLOCK, run.n)
            span_found = found[p0:p1]
            span_pos = pos[p0:p1]
            _search(self.keys(lo, hi), probes[p0:p1], span_found, span_pos)
            span_pos += lo
            if run.has_dead:
                at = np.flatnonzero(span_found)
                alive[p0:p1][at] = self.alive(lo, hi)[span_pos[at] - lo]
        return found, pos, alive


def _pread(fd: int, size: int, offset: int) -> bytes:
    data = os.pread(fd, size, offset)
    while len(data) < size:   # pread may return less than asked on some filesystems
        more = os.pread(fd, size - len(data), offset + len(data))
        if not more:
            raise OSError(errno.EIO, f"short read of a state tier file at {offset}")
        data += more
    return data


def _search(keys: np.ndarray, probes: np.ndarray, found: np.ndarray, pos: np.ndarray) -> None:
    """Fills found/pos (views) for sorted probes in sorted keys. Where the probes are many
    against the keys, the two are merged by a stable sort of both (numpy's merges sorted
    runs: for fixed-width bytes about three times faster than a binary search per probe),
    which places each key before the probes equal to it; else each probe is searched."""
    if len(probes) * _MERGE_SEARCH_RATIO >= len(keys):
        order = np.argsort(np.concatenate([keys, probes]), kind="stable")
        is_probe = order >= len(keys)
        # per probe, in their order (a stable sort keeps it): the keys at or below it
        at = np.cumsum(~is_probe)[is_probe] - 1
        hit = at >= 0
        hit[hit] = keys[at[hit]] == probes[hit]
    else:
        at = np.searchsorted(keys, probes)
        inside = at < len(keys)
        hit = np.zeros(len(probes), dtype=bool)
        hit[inside] = keys[at[inside]] == probes[inside]
    found |= hit
    pos[hit] = at[hit]


def delete_run_files(path: str) -> None:
    for suffix in (".keys", ".alive", ".arrow"):
        with contextlib.suppress(FileNotFoundError):   # a run without dead entries has no .alive
            os.remove(path + suffix)


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)
