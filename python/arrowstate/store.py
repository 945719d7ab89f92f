"""The versioned state of one operator partition, held in memory between micro-batches.

Like Spark's state store: a task works on version V and commits V + 1 as a delta (the rows
put and removed); every few versions a full snapshot is made so loading stays short. Files
are Arrow IPC streams of typed key and value columns plus an `__op` column (1 put, 0 remove),
data only. The JVM writes and reads them through Hadoop's filesystem layer.
"""
from __future__ import annotations

import heapq
import itertools
import sys
from typing import Any, Callable, Hashable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from . import keys as keycodec

FORMAT = b"arrowstate-state-1"
OP_PUT, OP_REMOVE = 1, 0


class CorruptStateFile(RuntimeError):
    """A state file that is not what its name says; the message names the file."""


class VersionedState:
    """Key -> value mapping with the changes since the last committed version."""

    def __init__(self, key_fields: Sequence[pa.Field], value_fields: Sequence[pa.Field]):
        self.key_fields = list(key_fields)
        self.value_fields = list(value_fields)
        self.data: dict[Hashable, Any] = {}
        self.version = 0
        self.last_snapshot_version = 0
        self._puts: dict[Hashable, Any] = {}
        self._removes: set[Hashable] = set()
        self._arrow_puts: list[list[pa.Array]] = []
        self._bytes_per_entry = 0.0
        self.index: Any = None  # a family's own index over the data (rebuilt on load)

    # -- reading and changing ------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.data)

    def put(self, key: Hashable, value: Any = None) -> None:
        self.data[key] = value
        self._puts[key] = value
        self._removes.discard(key)

    def put_rows(self, keys: Sequence[Hashable], values: Sequence[Any] | None,
                 columns: Sequence[pa.Array]) -> None:
        """Puts many keys whose key and value columns are at hand in Arrow: the delta takes
        those columns as they are instead of encoding the keys again."""
        if self._puts or self._removes:
            for k in keys:
                self._puts.pop(k, None)
                self._removes.discard(k)
        if values is None:
            self.data.update(dict.fromkeys(keys))
        else:
            self.data.update(zip(keys, values))
        self._arrow_puts.append(list(columns))

    def remove(self, key: Hashable) -> None:
        del self.data[key]
        self._puts.pop(key, None)
        self._removes.add(key)

    # -- files -------------------------------------------------------------------------
    def _schema(self, kind: str, version: int) -> pa.Schema:
        fields = [pa.field(f"k{i}", f.type) for i, f in enumerate(self.key_fields)]
        fields += [pa.field(f"v{i}", f.type) for i, f in enumerate(self.value_fields)]
        fields.append(pa.field("__op", pa.int8()))
        return pa.schema(fields, metadata={b"format": FORMAT, b"kind": kind.encode(),
                                           b"version": str(version).encode()})

    def _encode(self, kind: str, version: int, puts: Iterable[tuple[Hashable, Any]],
                removes: Iterable[Hashable], arrow_puts: Sequence[list[pa.Array]] = ()
                ) -> bytes:
        """Puts are applied before removes on load; Arrow puts before the other puts."""
        schema = self._schema(kind, version)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, schema) as writer:
            for cols in arrow_puts:
                ops = pa.array(np.full(len(cols[0]), OP_PUT, dtype=np.int8))
                writer.write_batch(pa.RecordBatch.from_arrays(cols + [ops], schema=schema))
            for chunk_puts in _chunks(puts, 65536):
                writer.write_batch(self._batch(schema, chunk_puts, OP_PUT))
            for chunk_removes in _chunks(((k, None) for k in removes), 65536):
                writer.write_batch(self._batch(schema, chunk_removes, OP_REMOVE))
        return sink.getvalue().to_pybytes()

    def _batch(self, schema: pa.Schema, items: list, op: int) -> pa.RecordBatch:
        key_cols = keycodec.columns([k for k, _ in items], [f.type for f in self.key_fields])
        if op == OP_PUT and self.value_fields:
            value_cols = keycodec.columns([v for _, v in items],
                                          [f.type for f in self.value_fields])
        else:
            value_cols = [pa.nulls(len(items), f.type) for f in self.value_fields]
        ops = pa.array([op] * len(items), pa.int8())
        return pa.RecordBatch.from_arrays(key_cols + value_cols + [ops], schema=schema)

    def commit_files(self, new_version: int, min_deltas_for_snapshot: int
                     ) -> tuple[bytes, bytes | None]:
        """The delta for new_version and, when it is time for one, a snapshot."""
        delta = self._encode("delta", new_version, self._puts.items(), self._removes,
                             self._arrow_puts)
        snapshot = None
        if new_version - self.last_snapshot_version >= max(1, min_deltas_for_snapshot):
            snapshot = self._encode("snapshot", new_version, self.data.items(), ())
        return delta, snapshot

    def mark_committed(self, new_version: int, made_snapshot: bool) -> None:
        self._sample_entry_size()
        self.version = new_version
        if made_snapshot:
            self.last_snapshot_version = new_version
        self._puts.clear()
        self._removes.clear()
        self._arrow_puts.clear()

    def load(self, files: Sequence[tuple[str, bytes]], version: int) -> None:
        """Applies a snapshot and the deltas after it, in order, to reach `version`."""
        self.data.clear()
        for name, payload in files:
            try:
                reader = pa.ipc.open_stream(payload)
                meta = reader.schema.metadata or {}
                if meta.get(b"format") != FORMAT:
                    raise CorruptStateFile("not an arrowstate state file")
                expected = [f.type for f in self.key_fields + self.value_fields]
                actual = [f.type for f in reader.schema][:-1]
                if actual != expected:
                    raise CorruptStateFile(
                        f"its columns {actual} are not this operator's {expected}")
                nk = len(self.key_fields)
                for batch in reader:
                    cols = batch.columns
                    ks = keycodec.rows(cols[:nk])
                    ops = cols[-1].to_pylist()
                    vs = keycodec.rows(cols[nk:-1]) if self.value_fields else [None] * len(ks)
                    for k, v, op in zip(ks, vs, ops):
                        if op == OP_PUT:
                            self.data[k] = v
                        else:
                            self.data.pop(k, None)
                if meta.get(b"kind") == b"snapshot":
                    self.last_snapshot_version = int(meta[b"version"])
            except CorruptStateFile as e:
                raise CorruptStateFile(f"arrowstate: state file {name} is unusable: {e}") from e
            except (pa.ArrowInvalid, pa.ArrowException, ValueError, KeyError) as e:
                raise CorruptStateFile(f"arrowstate: state file {name} is corrupt: {e}") from e
        self.version = version
        self._puts.clear()
        self._removes.clear()
        self._arrow_puts.clear()
        self._sample_entry_size(force=True)

    # -- memory ---------------------------------------------------------------------------
    def _sample_entry_size(self, force: bool = False) -> None:
        """Estimates bytes per entry from a few recent entries; never walks the whole state."""
        sample = list(itertools.islice(self._puts.items(), 32))
        if not sample and (force or self._arrow_puts):
            sample = list(itertools.islice(self.data.items(), 32))
        if sample:
            size = sum(_deep_size(k) + _deep_size(v) for k, v in sample) / len(sample)
            size += 100  # dict slot and hash overhead
            self._bytes_per_entry = (size if not self._bytes_per_entry
                                     else 0.8 * self._bytes_per_entry + 0.2 * size)

    def memory_bytes(self) -> int:
        extra = len(self.index) * 72 if self.index is not None else 0
        return int(len(self.data) * self._bytes_per_entry) + extra


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

    def add_many(self, times: np.ndarray, keys: Sequence[Hashable]) -> None:
        if len(keys) == 0:
            return
        order = np.argsort(times, kind="stable")
        bucket = _Bucket(np.asarray(times)[order], [keys[i] for i in order.tolist()])
        heapq.heappush(self._buckets, (int(bucket.times[0]), next(self._seq), bucket))
        self._size += len(keys)

    def pop_until(self, threshold: int, current_time: Callable[[Hashable], int | None]
                  ) -> Iterator[Hashable]:
        """Yields each key whose current time is <= threshold, once."""
        buckets = self._buckets
        while buckets and buckets[0][0] <= threshold:
            _, seq, bucket = heapq.heappop(buckets)
            cut = int(np.searchsorted(bucket.times, threshold, side="right"))
            expired = bucket.keys[bucket.start:cut]
            times = bucket.times[bucket.start:cut].tolist()
            self._size -= cut - bucket.start
            bucket.start = cut
            if cut < len(bucket.keys):
                heapq.heappush(buckets, (int(bucket.times[cut]), seq, bucket))
            for key, time in zip(expired, times):
                if current_time(key) == time:
                    yield key


class _Bucket:
    __slots__ = ("times", "keys", "start")

    def __init__(self, times: np.ndarray, keys: list) -> None:
        self.times, self.keys, self.start = times, keys, 0


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def _deep_size(v: Any) -> int:
    if isinstance(v, tuple):
        return sys.getsizeof(v) + sum(_deep_size(x) for x in v)
    return sys.getsizeof(v)
