"""Rows of one state partition with fixed-width keys, in sorted runs that may live on local
disk: the tier that lets state outgrow a worker's memory budget.

A run holds keys, sorted and unique, each with its state row (Arrow) and whether it is
alive (a removal is a dead entry that hides older runs' row of that key). Runs never
change: a put or a removal adds a run, and runs of similar size merge into one (the newer
entry of a key wins), so there are O(log n) runs and each row is copied O(log n) times.
Every operation is a few whole-batch numpy or Arrow calls per run, never a Python object
per key.

A run in memory is a numpy array of keys and an Arrow batch. A run on disk is three files
in the tier's directory, read with ordinary reads, never mapped, so the worker's resident
memory holds only what an operation reads and the kernel's page cache holds the rest:

    <n>.keys    the keys' fixed-width bytes, sorted
    <n>.alive   one byte per key (no file when every entry is alive)
    <n>.arrow   an Arrow IPC file of the rows, one record batch per block of BLOCK keys

The first key of each block stays in memory (`fences`), so finding keys reads only the
blocks they fall in; and every run has a Bloom filter in memory (10 bits a key), so a key
that is not in a run (a new key) is found absent without a search or a read. The files are a cache of what the checkpoint holds: a worker builds
them from the checkpoint's files and deletes them when it drops the state or exits.
"""
from __future__ import annotations

import contextlib
import errno
import itertools
import os
import shutil
import weakref
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa

from ..errors import ArrowStateError

BLOCK = 4096              # keys per block of a run on disk (one Arrow record batch each)
BLOOM_BITS_PER_KEY = 10   # about 1% false positives with BLOOM_HASHES
BLOOM_HASHES = 5
SEGMENT_KEYS = 52428      # keys per Bloom segment: 10 bits a key in 2**19 bits
BLOOM_MIN_KEYS = 1 << 12
FANOUT = 4                # runs of one size class merged into one  # a smaller run in memory is searched at once: no filter
SPAN_BLOCKS = 256         # the most blocks of keys one lookup reads at once (1M keys)
MERGE_ROWS = 1 << 17      # rows a merge or scan reads from each run at a time
DIR_SETTING = "spark.arrowstate.worker.localDir"
_sequence = itertools.count()


class LocalStateWriteFailed(ArrowStateError):
    """The tier could not write its files (a full disk, a missing or read-only directory)."""

    def __init__(self, path: str, error: OSError) -> None:
        full = error.errno in (errno.ENOSPC, errno.EDQUOT)
        what = ("the local disk is full" if full
                else f"{type(error).__name__}: {error.strerror or error}")
        super().__init__(
            "ARROWSTATE_LOCAL_STATE_WRITE_FAILED",
            f"arrowstate could not write state that is over the worker's memory budget to "
            f"{path}: {what}. Nothing committed is lost (the checkpoint holds it); free space "
            f"there, or point {DIR_SETTING} (default: Spark's local directories) at a disk "
            "with room, or give the workers more memory.",
            path=path, reason=what, setting=DIR_SETTING)


_U = np.uint64


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, on uint64 arrays (wrapping arithmetic)."""
    x = (x ^ (x >> _U(30))) * _U(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> _U(27))) * _U(0x94D049BB133111EB)
    return x ^ (x >> _U(31))


def key_hashes(keys: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each key (int64 or fixed-width bytes)."""
    if keys.dtype == np.int64:
        return _mix(keys.view(_U))
    width = keys.dtype.itemsize
    words = -(-width // 8)
    raw = np.zeros((len(keys), words * 8), dtype=np.uint8)
    raw[:, :width] = np.ascontiguousarray(keys).view(np.uint8).reshape(len(keys), width)
    raw = raw.view(_U)
    h = np.full(len(keys), _U(width), dtype=_U)
    for w in range(words):
        h = _mix(h ^ raw[:, w])
    return h


class _Bloom:
    """A Bloom filter over a run's keys, in segments of SEGMENT_KEYS consecutive keys (in key
    order), each with bits of its own: a key's segment is found by its first key, so a
    filter is built a segment at a time as a run is written, with small temporaries."""

    __slots__ = ("bits", "firsts", "segment_bits")

    def __init__(self, bits: np.ndarray, firsts: np.ndarray, segment_bits: int) -> None:
        self.bits, self.firsts, self.segment_bits = bits, firsts, segment_bits

    @property
    def nbytes(self) -> int:
        return self.bits.nbytes + self.firsts.nbytes

    @staticmethod
    def positions(hashes: np.ndarray, segment_bits: int):
        mask = _U(segment_bits - 1)
        step = _mix(hashes ^ _U(0x9E3779B97F4A7C15)) | _U(1)
        for i in range(BLOOM_HASHES):
            yield ((hashes + _U(i) * step) & mask).astype(np.int64)

    def may_hold(self, probes: np.ndarray, hashes: np.ndarray) -> np.ndarray:
        segment = np.searchsorted(self.firsts, probes, side="right") - 1
        maybe = segment >= 0            # below the run's first key: not in it
        base = np.maximum(segment, 0) * self.segment_bits
        for positions in self.positions(hashes, self.segment_bits):
            positions += base
            maybe &= (self.bits[positions >> 3] >> (positions & 7).astype(np.uint8)) & 1 == 1
        return maybe


class _BloomBuilder:
    """Builds a run's _Bloom from its keys in key order, a segment at a time; `expected`
    keys (at least) size each segment's bits."""

    def __init__(self, expected: int) -> None:
        self.segment_bits = 64
        while self.segment_bits < min(max(expected, 1), SEGMENT_KEYS) * BLOOM_BITS_PER_KEY:
            self.segment_bits *= 2
        self._parts: list[np.ndarray] = []
        self._firsts: list[np.ndarray] = []
        self._keys: list[np.ndarray] = []
        self._pending = 0

    def add(self, keys: np.ndarray) -> None:
        self._keys.append(keys)
        self._pending += len(keys)
        while self._pending >= SEGMENT_KEYS:
            self._segment(SEGMENT_KEYS)

    def _segment(self, size: int) -> None:
        keys = np.concatenate(self._keys) if len(self._keys) > 1 else self._keys[0]
        segment, rest = keys[:size], keys[size:]
        self._keys, self._pending = ([rest] if len(rest) else []), len(rest)
        marks = np.zeros(self.segment_bits, dtype=bool)
        for positions in _Bloom.positions(key_hashes(segment), self.segment_bits):
            marks[positions] = True
        self._parts.append(np.packbits(marks, bitorder="little"))
        self._firsts.append(segment[:1])

    def finish(self, dtype: np.dtype) -> _Bloom:
        if self._pending:
            self._segment(self._pending)
        firsts = np.concatenate(self._firsts) if self._firsts else np.zeros(0, dtype)
        bits = (np.concatenate(self._parts) if self._parts else np.zeros(0, np.uint8))
        return _Bloom(bits, firsts, self.segment_bits)


class _Run:
    """One run: in memory (`keys`, `alive`, `rows`) or on disk (`path`, `fences`), and the
    Bloom filter of its keys."""

    __slots__ = ("n", "keys", "alive", "rows", "path", "fences", "has_dead", "disk_bytes",
                 "bloom", "__weakref__")

    def __init__(self, n: int) -> None:
        self.n = n
        self.keys: np.ndarray | None = None
        self.alive: np.ndarray | None = None     # None: every entry alive
        self.rows: pa.RecordBatch | None = None
        self.path: str | None = None
        self.fences: np.ndarray | None = None
        self.has_dead = False
        self.disk_bytes = 0
        self.bloom: _Bloom | None = None

    @classmethod
    def in_memory(cls, keys: np.ndarray, alive: np.ndarray | None,
                  rows: pa.RecordBatch) -> "_Run":
        run = cls(len(keys))
        run.keys, run.rows = keys, rows
        if len(keys) >= BLOOM_MIN_KEYS:
            builder = _BloomBuilder(len(keys))
            builder.add(keys)
            run.bloom = builder.finish(keys.dtype)
        if alive is not None and not alive.all():
            run.alive, run.has_dead = alive, True
        return run

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
            _delete_run_files(self.path)


class _Reader:
    """Reads a run (its files held open, so a merge that deletes them meanwhile does not
    disturb a reader that started before)."""

    def __init__(self, run: _Run, dtype: np.dtype) -> None:
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
        maybe = (np.arange(len(probes)) if hashes is None or run.bloom is None
                 else np.flatnonzero(run.bloom.may_hold(probes, hashes)))
        if len(maybe) < len(probes):
            f, p, a = self.find(probes[maybe], None) if len(maybe) else (found[:0],) * 3
            found[maybe], pos[maybe], alive[maybe] = f, p, a
            return found, pos, alive
        return self._search_run(probes, found, pos, alive)

    def _search_run(self, probes, found, pos, alive):
        run = self.run
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
    """Fills found/pos (views) for probes in sorted keys."""
    at = np.searchsorted(keys, probes)
    inside = at < len(keys)
    hit = np.zeros(len(probes), dtype=bool)
    hit[inside] = keys[at[inside]] == probes[inside]
    found |= hit
    pos[hit] = at[hit]


def _newest_of_each(keys: np.ndarray) -> np.ndarray:
    """Positions that keep, for each distinct key, its last occurrence; in key order."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    last = np.ones(len(order), dtype=bool)
    last[:-1] = ordered[1:] != ordered[:-1]
    return order[last]


class _Cursor:
    """Reads a run in chunks, for merges and full scans."""

    def __init__(self, reader: _Reader, chunk: int) -> None:
        self.reader, self.chunk, self.next = reader, chunk, 0
        self.keys = self.alive = self.rows = None

    def fill(self) -> bool:
        """Has buffered entries (reading the next chunk if the buffer is empty)."""
        if self.keys is not None and len(self.keys):
            return True
        n = self.reader.run.n
        if self.next >= n:
            return False
        hi = min(self.next + self.chunk, n)
        self.keys = self.reader.keys(self.next, hi)
        self.alive = self.reader.alive(self.next, hi)
        self.rows = self.reader.rows(self.next, hi)
        self.next = hi
        return True

    def take_to(self, bound) -> tuple[np.ndarray, np.ndarray, pa.RecordBatch]:
        cut = int(np.searchsorted(self.keys, bound, side="right"))
        out = self.keys[:cut], self.alive[:cut], self.rows.slice(0, cut)
        self.keys, self.alive = self.keys[cut:], self.alive[cut:]
        self.rows = self.rows.slice(cut)
        return out


def _merged(readers: Sequence[_Reader], chunk: int, keep_dead: bool
            ) -> Iterator[tuple[np.ndarray, np.ndarray, pa.RecordBatch]]:
    """The entries of runs (oldest first) merged in key order, the newest entry of each key
    winning, in pieces of about `chunk` per run: (keys, alive, rows). Dead entries are
    left out unless `keep_dead` (a merge that older runs still lie below must keep them)."""
    cursors = [_Cursor(r, chunk) for r in readers]
    while True:
        active = [c for c in cursors if c.fill()]
        if not active:
            return
        bound = min(c.keys[-1] for c in active)
        parts = [c.take_to(bound) for c in active]
        keys, alive, rows = parts[0]
        for newer in parts[1:]:
            keys, alive, rows = _merge_two((keys, alive, rows), newer)
        if not keep_dead and not alive.all():
            keys, rows = keys[alive], rows.filter(pa.array(alive))
            alive = alive[alive]
        if len(keys):
            yield keys, alive, rows


def _size_class(n: int) -> int:
    """Runs within a factor FANOUT of each other share a class."""
    size_class = 0
    while n >= FANOUT:
        n //= FANOUT
        size_class += 1
    return size_class


def _merge_two(older, newer):
    """Two sorted pieces of unique keys as one, the newer entry of a key winning: the newer
    keys' places found by binary search, not by sorting both again."""
    a_keys, a_alive, a_rows = older
    b_keys, b_alive, b_rows = newer
    if not len(a_keys):
        return newer
    if not len(b_keys):
        return older
    at = np.searchsorted(a_keys, b_keys)
    inside = at < len(a_keys)
    replaced = np.zeros(len(a_keys), dtype=bool)
    dup = np.zeros(len(b_keys), dtype=bool)
    dup[inside] = a_keys[at[inside]] == b_keys[inside]
    replaced[at[dup]] = True
    kept_a = np.flatnonzero(~replaced)
    # each newer key goes before the older keys at or after it that are kept
    b_place = np.searchsorted(kept_a, at) + np.arange(len(b_keys))
    total = len(kept_a) + len(b_keys)
    source = np.empty(total, dtype=np.int64)     # index into concat(kept older, newer)
    is_b = np.zeros(total, dtype=bool)
    is_b[b_place] = True
    source[~is_b] = np.arange(len(kept_a))
    source[b_place] = len(kept_a) + np.arange(len(b_keys))
    keys = np.concatenate([a_keys[kept_a], b_keys])[source]
    alive = np.concatenate([a_alive[kept_a], b_alive])[source]
    rows = pa.concat_batches([a_rows.take(pa.array(kept_a)), b_rows]).take(pa.array(source))
    return keys, alive, rows


class _RunWriter:
    """Writes a run's files from entries in key order."""

    def __init__(self, path: str, schema: pa.Schema, expected: int,
                 bloom: "_Bloom | None" = None) -> None:
        """`expected`: at least the keys it will hold; `bloom`: their filter, if made."""
        self.path = path
        self.n, self.has_dead = 0, False
        self.fences: list[np.ndarray] = []
        self.bloom = _BloomBuilder(expected) if bloom is None else bloom
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        try:
            self._keys = open(path + ".keys", "wb")
            self._alive = open(path + ".alive", "wb")
            self._sink = pa.OSFile(path + ".arrow", "wb")
            self._arrow = pa.ipc.new_file(self._sink, schema)
        except OSError as e:
            raise LocalStateWriteFailed(path, e) from e

    def write(self, keys: np.ndarray, alive: np.ndarray, rows: pa.RecordBatch) -> None:
        try:
            start = (-self.n) % BLOCK   # the first key of each new block is a fence
            self.fences.append(keys[start::BLOCK].copy())
            if isinstance(self.bloom, _BloomBuilder):
                self.bloom.add(keys)
            self._keys.write(memoryview(np.ascontiguousarray(keys)).cast("B"))
            self._alive.write(alive.astype(np.uint8).tobytes())
            self.has_dead |= not alive.all()
            self.n += len(keys)
            self._pending.append(rows)
            self._pending_rows += rows.num_rows
            while self._pending_rows >= BLOCK:
                self._flush_block(BLOCK)
        except OSError as e:
            raise LocalStateWriteFailed(self.path, e) from e

    def _flush_block(self, size: int) -> None:
        rows = pa.concat_batches(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._arrow.write_batch(rows.slice(0, size))
        rest = rows.slice(size)
        self._pending = [rest] if rest.num_rows else []
        self._pending_rows = rest.num_rows

    def finish(self, dtype: np.dtype) -> _Run:
        try:
            if self._pending_rows:
                self._flush_block(self._pending_rows)
            self._arrow.close()
            self._sink.close()
            self._keys.close()
            self._alive.close()
        except OSError as e:
            raise LocalStateWriteFailed(self.path, e) from e
        if not self.has_dead:
            os.remove(self.path + ".alive")
        run = _Run(self.n)
        run.path, run.has_dead = self.path, self.has_dead
        run.fences = (np.concatenate(self.fences) if self.fences
                      else np.zeros(0, dtype=dtype))
        run.bloom = (self.bloom.finish(dtype) if isinstance(self.bloom, _BloomBuilder)
                     else self.bloom)
        run.disk_bytes = sum(os.path.getsize(self.path + s) for s in
                             ((".keys", ".alive", ".arrow") if self.has_dead
                              else (".keys", ".arrow")))
        return run

    def abandon(self) -> None:
        for f in (self._keys, self._alive):
            f.close()
        with contextlib.suppress(pa.ArrowException, OSError):   # abandoned: its file goes
            self._arrow.close()
        self._sink.close()
        _delete_run_files(self.path)


def _delete_run_files(path: str) -> None:
    for suffix in (".keys", ".alive", ".arrow"):
        with contextlib.suppress(FileNotFoundError):   # a run without dead entries has no .alive
            os.remove(path + suffix)


def _empty(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


class TieredRows:
    """Key -> Arrow row mapping for keys of one fixed width (`dtype`, see
    `arrowstate.keys.key_dtype`), with KeyedRows' operations on key arrays. Runs whose
    rows pass `memory_cap` bytes, and any the worker spills, live in `directory`."""

    def __init__(self, schema: pa.Schema, dtype: np.dtype, directory: str,
                 memory_cap: int) -> None:
        self.schema, self.dtype = schema, np.dtype(dtype)
        self.directory, self.memory_cap = directory, memory_cap
        self.runs: list[_Run] = []     # oldest first
        self._live = 0
        self._made_directory = False
        self._cleanup = weakref.finalize(self, shutil.rmtree, directory, True)

    def __len__(self) -> int:
        return self._live

    def close(self) -> None:
        """Deletes the tier's files."""
        self.runs = []
        self._live = 0
        self._cleanup()

    def clear(self) -> None:
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
        hashes = key_hashes(probes)
        run_of = np.full(len(keys), -1, dtype=np.int64)
        pos = np.zeros(len(keys), dtype=np.int64)
        alive = np.zeros(len(keys), dtype=bool)
        open_ = np.arange(len(keys))
        for r in range(len(self.runs) - 1, -1, -1):
            if not len(open_):
                break
            reader = _Reader(self.runs[r], self.dtype)
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
        ids = np.asarray(ids, dtype=np.int64)
        if len(ids) == 0:
            return _empty(self.schema)
        starts = np.cumsum([0] + [r.n for r in self.runs], dtype=np.int64)
        order = np.argsort(ids, kind="stable")
        sorted_ids = ids[order]
        run_of = np.searchsorted(starts, sorted_ids, side="right") - 1
        bounds = np.searchsorted(run_of, np.arange(len(self.runs) + 1))
        parts = []
        for r, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
            if lo < hi:
                reader = _Reader(self.runs[r], self.dtype)
                try:
                    parts.append(reader.rows_at(sorted_ids[lo:hi] - starts[r]))
                finally:
                    reader.close()
        rows = parts[0] if len(parts) == 1 else pa.concat_batches(parts)
        if np.any(order[1:] < order[:-1]):
            inverse = np.empty_like(order)
            inverse[order] = np.arange(len(order))
            rows = rows.take(pa.array(inverse))
        return pa.RecordBatch.from_arrays(rows.columns, schema=self.schema)

    def first_absent(self, keys: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """Of the candidate positions, those holding the first occurrence of a key that is
        not in state, in position order."""
        if not len(candidates):
            return candidates
        picked = keys[candidates]
        order = np.argsort(picked, kind="stable")
        ordered = picked[order]
        first = np.ones(len(order), dtype=bool)
        first[1:] = ordered[1:] != ordered[:-1]
        distinct = order[first]
        absent = self.lookup(picked[distinct]) < 0
        return np.sort(candidates[distinct[absent]])

    def items(self, batch_size: int) -> Iterator[tuple[np.ndarray, pa.RecordBatch]]:
        """Every live key with its row, in key order, a piece at a time."""
        frozen = self.frozen()
        yield from frozen.items(batch_size)

    def frozen(self) -> "FrozenTier":
        """The live rows as they are now, readable from another thread while this changes
        (runs never change, and their files are held open)."""
        return FrozenTier(self.schema, self.dtype, list(self.runs))

    def all_rows(self, batch_size: int) -> Iterator[pa.RecordBatch]:
        return self.frozen().batches(batch_size)

    # -- changing -----------------------------------------------------------------------
    def insert(self, keys: np.ndarray, batch: pa.RecordBatch) -> None:
        """Stores one row per key (the last of repeated keys wins)."""
        if not len(keys):
            return
        keys = np.asarray(keys, dtype=self.dtype)
        pick = _newest_of_each(keys)
        keys = keys[pick]
        present = self.lookup(keys) >= 0
        self._live += int(len(keys) - present.sum())
        rows = batch.take(pa.array(pick)) if len(pick) != batch.num_rows or np.any(
            pick != np.arange(len(pick))) else batch
        self._add(_Run.in_memory(keys, None, pa.RecordBatch.from_arrays(
            rows.columns, schema=self.schema)))

    def pop_present(self, keys: np.ndarray) -> pa.RecordBatch:
        """Removes those of the keys that are present (repeats count once); returns their rows."""
        keys = np.asarray(keys, dtype=self.dtype)
        ids = self.lookup(keys)
        found = np.flatnonzero(ids >= 0)
        once = found[_newest_of_each(ids[found])]   # in row-id order
        rows = self.take(ids[once])
        self._remove(keys[once])
        return rows

    def discard(self, keys: np.ndarray) -> None:
        """Removes the keys, present or not, without reading their rows."""
        self._remove(keys)

    def _remove(self, keys: np.ndarray) -> None:
        if not len(keys) or not self.runs:
            return
        keys = np.asarray(keys, dtype=self.dtype)
        keys = keys[_newest_of_each(keys)]
        present = self.lookup(keys) >= 0
        keys = keys[present]
        if not len(keys):
            return
        self._live -= len(keys)
        empty = pa.RecordBatch.from_arrays(
            [pa.nulls(len(keys), f.type) for f in self.schema], schema=self.schema)
        self._add(_Run.in_memory(keys, np.zeros(len(keys), dtype=bool), empty))

    def _add(self, run: _Run) -> None:
        """Appends a run, then merges the newest runs once FANOUT of them are of one size
        class or smaller (tiered merging: each row is copied about log_FANOUT(n / first
        run) times, and at most FANOUT - 1 runs of each class are probed; Bloom filters
        keep probing cheap)."""
        self.runs.append(run)
        while True:
            size_class = _size_class(self.runs[-1].n)
            tail = 0
            for older in reversed(self.runs):
                if _size_class(older.n) > size_class:
                    break
                tail += 1
            if tail < FANOUT:
                break
            merged = self.runs[-tail:]
            del self.runs[-tail:]
            self.runs.append(self._merge(merged, bottom=not self.runs))
        if not self.runs[-1].on_disk and self.runs[-1].memory_bytes() > self.memory_cap:
            self.runs[-1] = self._write(self.runs[-1])

    def _merge(self, runs: list[_Run], bottom: bool) -> _Run:
        """One run from several (oldest first). Dead entries are dropped at the bottom (no
        older run left to hide). The result goes to disk when any input is there or its
        rows would pass the memory cap."""
        to_disk = (any(r.on_disk for r in runs)
                   or sum(r.memory_bytes() for r in runs) > self.memory_cap)
        readers = [_Reader(r, self.dtype) for r in runs]
        try:
            pieces = _merged(readers, MERGE_ROWS, keep_dead=not bottom)
            if to_disk:
                merged = self._write_pieces(pieces, sum(r.n for r in runs))
            else:
                parts = list(pieces)
                if parts:
                    keys = np.concatenate([k for k, _, _ in parts])
                    alive = np.concatenate([a for _, a, _ in parts])
                    rows = pa.concat_batches([r for _, _, r in parts])
                else:
                    keys, alive = np.zeros(0, self.dtype), np.zeros(0, bool)
                    rows = _empty(self.schema)
                merged = _Run.in_memory(keys, alive, rows)
        finally:
            for reader in readers:
                reader.close()
        for run in runs:
            run.delete_files()
        return merged

    def _write(self, run: _Run) -> _Run:
        reader = _Reader(run, self.dtype)
        try:
            return self._write_pieces(iter([(reader.keys(0, run.n), reader.alive(0, run.n),
                                             reader.rows(0, run.n))] if run.n else []),
                                      run.n, run.bloom)
        finally:
            reader.close()

    def _write_pieces(self, pieces, expected: int, bloom: _Bloom | None = None) -> _Run:
        if not self._made_directory:
            try:
                os.makedirs(self.directory, exist_ok=True)
            except OSError as e:
                raise LocalStateWriteFailed(self.directory, e) from e
            self._made_directory = True
        writer = _RunWriter(os.path.join(self.directory, str(next(_sequence))), self.schema,
                            expected, bloom)
        try:
            for keys, alive, rows in pieces:
                writer.write(keys, alive, rows)
            return writer.finish(self.dtype)
        except BaseException:
            writer.abandon()
            raise

    def spill(self) -> int:
        """Writes every run held in memory to disk; the bytes of memory it gives back."""
        freed = 0
        for i, run in enumerate(self.runs):
            if not run.on_disk and run.n:
                freed += run.memory_bytes()
                self.runs[i] = self._write(run)
        return freed

    def compact_if_sparse(self) -> None:
        """Runs merge as they are added; nothing to do after a commit."""

    # -- memory -------------------------------------------------------------------------
    def memory_bytes(self) -> int:
        return sum(r.memory_bytes() for r in self.runs)

    def disk_bytes(self) -> int:
        return sum(r.disk_bytes for r in self.runs)


class FrozenTier:
    """A consistent view of the live rows at one moment, in key order."""

    def __init__(self, schema: pa.Schema, dtype: np.dtype, runs: list[_Run]) -> None:
        self.schema, self.dtype = schema, dtype
        # files are opened now: a merge may delete them before the view is read
        self._readers = [_Reader(r, dtype) for r in runs]

    def __del__(self) -> None:
        self.close()

    def close(self) -> None:
        readers, self._readers = self._readers, []
        for reader in readers:
            reader.close()

    def items(self, batch_size: int) -> Iterator[tuple[np.ndarray, pa.RecordBatch]]:
        try:
            for keys, _, rows in _merged(self._readers, max(1, min(batch_size, MERGE_ROWS)),
                                         keep_dead=False):
                rows = pa.RecordBatch.from_arrays(rows.columns, schema=self.schema)
                for lo in range(0, len(keys), max(1, batch_size)):
                    yield keys[lo:lo + batch_size], rows.slice(lo, batch_size)
        finally:
            self.close()

    def batches(self, batch_size: int) -> Iterator[pa.RecordBatch]:
        for _, rows in self.items(batch_size):
            yield rows
