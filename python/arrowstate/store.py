"""The versioned state of one operator partition, held in memory between micro-batches.

Rows stay Arrow: each put appends a record batch (a "chunk") of key and value columns, and a
dict maps every live key to its row's global id. Lookups, evictions, snapshots and deltas
are Arrow `take`s, so values never turn into Python objects and keep their exact types.
Replaced and removed rows are dead until a compaction rewrites the live ones.

Like Spark's state store, a task works on version V and commits V + 1 as a delta (the puts
and removes, in order); every few versions a full snapshot is made so loading stays short.
Files are Arrow IPC streams of the key and value columns plus an `__op` column (1 put,
0 remove). The JVM writes and reads them through Hadoop's filesystem layer.
"""
from __future__ import annotations

import collections
import heapq
import itertools
import sys
import threading
from typing import Hashable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from . import keys as keycodec

FORMAT = b"arrowstate-state-1"
OP_PUT, OP_REMOVE = 1, 0
_MIN_DEAD_FOR_COMPACTION = 65536


class CorruptStateFile(RuntimeError):
    """A state file that is not what its name says; the message names the file."""


class VersionedState:
    """Key -> Arrow row mapping with the changes since the last committed version."""

    def __init__(self, key_fields: Sequence[pa.Field], value_fields: Sequence[pa.Field]):
        self.key_count = len(key_fields)
        fields = [pa.field(f"k{i}", f.type) for i, f in enumerate(key_fields)]
        fields += [pa.field(f"v{i}", f.type) for i, f in enumerate(value_fields)]
        self.schema = pa.schema(fields)
        self.data: dict[Hashable, int] = {}   # key -> global row id
        self.version = 0
        self.last_snapshot_version = 0
        self.index = TimeIndex()  # the family's expiry/timeout index (rebuilt on load)
        self._chunks: list[pa.RecordBatch] = []
        self._starts: list[int] = []           # global id of each chunk's first row
        self._next_id = 0
        self._dead = 0
        self._changes: list[pa.RecordBatch] = []   # this version's puts and removes, in order
        self._snapshot: _Snapshot | None = None
        self._key_bytes = 0.0

    def __len__(self) -> int:
        return len(self.data)

    # -- changing ---------------------------------------------------------------------------
    def put_rows(self, keys: Sequence[Hashable], batch: pa.RecordBatch) -> None:
        """Stores one row per key; `batch` holds the key then the value columns."""
        if len(keys) == 0:
            return
        batch = pa.RecordBatch.from_arrays(batch.columns, schema=self.schema)
        self._insert(keys, batch)
        self._changes.append(_with_op(batch, OP_PUT))

    def pop_present(self, keys: Sequence[Hashable]) -> pa.RecordBatch:
        """Removes those of the keys that are present (repeats count once); returns their rows."""
        ids = self.lookup(keys)
        found = ids >= 0
        ids, first = np.unique(ids[found], return_index=True)
        found_keys = list(itertools.compress(keys, found.tolist()))
        gone = [found_keys[i] for i in first.tolist()]
        collections.deque(map(self.data.__delitem__, gone), maxlen=0)  # a loop in C
        rows = self.take(ids)
        self._dead += len(ids)
        if len(ids):
            removed = rows.columns[: self.key_count] + [
                pa.nulls(len(ids), f.type) for f in list(self.schema)[self.key_count:]]
            self._changes.append(_with_op(
                pa.RecordBatch.from_arrays(removed, schema=self.schema), OP_REMOVE))
        return rows

    def _insert(self, keys: Sequence[Hashable], batch: pa.RecordBatch) -> None:
        before = len(self.data)
        start = self._next_id
        self.data.update(zip(keys, range(start, start + len(keys))))
        self._dead += len(keys) - (len(self.data) - before)
        self._chunks.append(batch)
        self._starts.append(start)
        self._next_id += batch.num_rows
        # Binary-counter merging keeps O(log n) chunks; each row is copied O(log n) times.
        while len(self._chunks) >= 2 and (self._chunks[-1].num_rows
                                          >= self._chunks[-2].num_rows):
            last = self._chunks.pop()
            self._starts.pop()
            self._chunks[-1] = pa.concat_batches([self._chunks[-1], last])

    # -- reading ----------------------------------------------------------------------------
    def lookup(self, keys: Sequence[Hashable]) -> np.ndarray:
        """Each key's row id, -1 where the key is absent."""
        return np.fromiter(map(self.data.get, keys, itertools.repeat(-1)), dtype=np.int64,
                           count=len(keys))

    def take(self, ids: np.ndarray) -> pa.RecordBatch:
        """Rows by global id, in the order given."""
        return _take(self.schema, self._chunks, self._starts, ids)

    def live_ids(self) -> np.ndarray:
        """Every live row id, in the dict's key order."""
        return np.fromiter(self.data.values(), dtype=np.int64, count=len(self.data))

    def all_rows(self, batch_size: int) -> Iterator[pa.RecordBatch]:
        return _batches_by_id(self.schema, self._chunks, self._starts,
                              np.sort(self.live_ids()), batch_size)

    # -- files ------------------------------------------------------------------------------
    def _file_schema(self, kind: str, version: int) -> pa.Schema:
        return self.schema.append(pa.field("__op", pa.int8())).with_metadata(
            {b"format": FORMAT, b"kind": kind.encode(), b"version": str(version).encode()})

    def _encode(self, kind: str, version: int, batches: Sequence[pa.RecordBatch]) -> bytes:
        schema = self._file_schema(kind, version)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, schema) as writer:
            for b in batches:
                writer.write_batch(pa.RecordBatch.from_arrays(b.columns, schema=schema))
        return sink.getvalue().to_pybytes()

    def commit_files(self, new_version: int) -> tuple[bytes, list[tuple[int, bytes]]]:
        """The delta for new_version, and the snapshots (of earlier versions) made meanwhile."""
        delta = self._encode("delta", new_version, self._changes)
        snapshots = []
        if self._snapshot is not None and not self._snapshot.is_alive():
            snapshots.append(self._snapshot.result())
            self._snapshot = None
        return delta, snapshots

    def mark_committed(self, new_version: int, min_deltas_for_snapshot: int) -> None:
        """The JVM wrote new_version's files. When a snapshot is due, it is made from this
        version in a thread, off the micro-batch's path, and shipped with a later commit."""
        self.version = new_version
        self._changes.clear()
        if self._dead > max(len(self.data), _MIN_DEAD_FOR_COMPACTION):
            self._compact()
        due = new_version - self.last_snapshot_version >= max(1, min_deltas_for_snapshot)
        if due and self._snapshot is None:
            # chunks are immutable and the lists are copied: later batches cannot disturb it
            self._snapshot = _Snapshot(self, new_version)
            self.last_snapshot_version = new_version

    def wait_for_snapshot(self) -> None:
        if self._snapshot is not None:
            self._snapshot.join()

    def _compact(self) -> None:
        """Rewrites the live rows into one chunk: O(live), run once dead rows outnumber them."""
        ids = self.live_ids()
        order = np.argsort(ids, kind="stable")
        rows = self.take(ids[order])
        new_ids = np.empty_like(ids)
        new_ids[order] = np.arange(len(ids))
        self.data = dict(zip(self.data.keys(), new_ids.tolist()))
        self._chunks, self._starts = [rows], [0]
        self._next_id, self._dead = rows.num_rows, 0

    def load(self, files: Sequence[tuple[str, bytes]], version: int) -> None:
        """Applies a snapshot and the deltas after it, in order, to reach `version`."""
        self.data.clear()
        self._chunks, self._starts, self._next_id, self._dead = [], [], 0, 0
        for name, payload in files:
            try:
                reader = pa.ipc.open_stream(payload)
                meta = reader.schema.metadata or {}
                if meta.get(b"format") != FORMAT:
                    raise CorruptStateFile("not an arrowstate state file")
                expected = [f.type for f in self.schema]
                actual = [f.type for f in reader.schema][:-1]
                if actual != expected:
                    raise CorruptStateFile(
                        f"its columns {actual} are not this operator's {expected}")
                for batch in reader:
                    self._apply(batch)
                if meta.get(b"kind") == b"snapshot":
                    self.last_snapshot_version = int(meta[b"version"])
            except CorruptStateFile as e:
                raise CorruptStateFile(f"arrowstate: state file {name} is unusable: {e}") from e
            except (pa.ArrowInvalid, pa.ArrowException, ValueError, KeyError) as e:
                raise CorruptStateFile(f"arrowstate: state file {name} is corrupt: {e}") from e
        self.version = version
        self._changes.clear()

    def _apply(self, batch: pa.RecordBatch) -> None:
        """Replays a file batch: runs of puts and removes, in order."""
        ops = batch.column(batch.num_columns - 1).to_numpy(zero_copy_only=False)
        cuts = np.flatnonzero(np.diff(ops)) + 1
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(ops)]):
            run = pa.RecordBatch.from_arrays(batch.slice(lo, hi - lo).columns[:-1],
                                             schema=self.schema)
            run_keys = keycodec.rows(run.columns[: self.key_count], run.num_rows)
            if ops[lo] == OP_PUT:
                self._insert(run_keys, run)
            else:
                for k in run_keys:
                    self.data.pop(k, None)
                self._dead += len(run_keys)

    # -- memory -----------------------------------------------------------------------------
    def memory_bytes(self) -> int:
        """Arrow chunks plus an estimate of the dict (sampled key sizes, never a full walk)."""
        sample = list(itertools.islice(self.data, 32))
        if sample:
            size = sum(_deep_size(k) for k in sample) / len(sample) + 100  # slot, hash, id
            self._key_bytes = size if not self._key_bytes else 0.8 * self._key_bytes + 0.2 * size
        return (sum(c.nbytes for c in self._chunks) + int(len(self.data) * self._key_bytes)
                + len(self.index) * 72)


def _take(schema: pa.Schema, chunks: Sequence[pa.RecordBatch], starts: Sequence[int],
          ids: np.ndarray) -> pa.RecordBatch:
    """Rows by global id from these chunks, in the order given."""
    if len(ids) == 0:
        return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema],
                                          schema=schema)
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    starts = np.asarray(starts, dtype=np.int64)
    chunk_of = np.searchsorted(starts, sorted_ids, side="right") - 1
    bounds = np.searchsorted(chunk_of, np.arange(len(chunks) + 1))
    parts = [chunks[c].take(pa.array(sorted_ids[lo:hi] - starts[c]))
             for c, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])) if lo < hi]
    rows = parts[0] if len(parts) == 1 else pa.concat_batches(parts)
    if np.any(order[1:] < order[:-1]):
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        rows = rows.take(pa.array(inverse))
    return rows


def _batches_by_id(schema: pa.Schema, chunks: Sequence[pa.RecordBatch], starts: Sequence[int],
                   ids: np.ndarray, batch_size: int) -> Iterator[pa.RecordBatch]:
    for lo in range(0, len(ids), max(1, batch_size)):
        yield _take(schema, chunks, starts, ids[lo:lo + batch_size])


def _with_op(batch: pa.RecordBatch, op: int) -> pa.RecordBatch:
    ops = pa.array(np.full(batch.num_rows, op, dtype=np.int8))
    return pa.RecordBatch.from_arrays(batch.columns + [ops],
                                      names=batch.schema.names + ["__op"])


class _Snapshot(threading.Thread):
    """Encodes a snapshot of one committed version; Arrow's take and IPC release the GIL."""

    def __init__(self, state: VersionedState, version: int) -> None:
        super().__init__(name=f"arrowstate-snapshot-{version}", daemon=True)
        self.version = version
        self._encode = state._encode
        self._schema = state.schema
        self._chunks, self._starts = list(state._chunks), list(state._starts)
        self._ids = np.sort(state.live_ids())
        self._bytes: bytes | None = None
        self._error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            rows = _batches_by_id(self._schema, self._chunks, self._starts, self._ids, 1 << 20)
            self._bytes = self._encode("snapshot", self.version,
                                       [_with_op(b, OP_PUT) for b in rows])
        except BaseException as e:  # surfaced by result(), in the task that ships it
            self._error = e

    def result(self) -> tuple[int, bytes]:
        self.join()
        if self._error is not None:
            raise self._error
        return self.version, self._bytes


class TimeIndex:
    """Keys ordered by the time they expire, so eviction touches only what it evicts.

    Keys arrive a batch at a time: each batch becomes a bucket sorted by time (one numpy
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


class _Bucket:
    __slots__ = ("times", "keys", "start")

    def __init__(self, times: np.ndarray, keys: list) -> None:
        self.times, self.keys, self.start = times, keys, 0


def _deep_size(v: object) -> int:
    if isinstance(v, tuple):
        return sys.getsizeof(v) + sum(_deep_size(x) for x in v)
    return sys.getsizeof(v)
