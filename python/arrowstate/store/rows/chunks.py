"""Rows appended a record batch (a "chunk") at a time, each with a global id, read by id
with Arrow `take`s: the row storage under the dict (`keyed`) and the hash table (`hashed`),
and the read by id the tier shares (`take_by_id`)."""
from __future__ import annotations

from typing import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa

# dead rows a store holds (beyond as many as its live ones) before a compaction rewrites them
MIN_DEAD_FOR_COMPACTION = 65536


class RowChunks:
    """Rows appended a record batch (a "chunk") at a time, each with a global id: its
    place in the order of appends. Reads are Arrow `take`s by id."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.chunks: list[pa.RecordBatch] = []
        self.starts: list[int] = []   # global id of each chunk's first row
        self.next_id = 0
        # the chunks' bytes (their buffers' sizes), kept as they change: a task asks after
        # each commit; pyarrow's nbytes would walk every array's ranges (10 us a batch)
        self._bytes = 0

    def clear(self) -> None:
        self.chunks, self.starts, self.next_id, self._bytes = [], [], 0, 0

    def append(self, batch: pa.RecordBatch) -> int:
        """Adds the batch's rows; returns the id of its first row."""
        start = self.next_id
        self.chunks.append(batch)
        self.starts.append(start)
        self.next_id += batch.num_rows
        self._bytes += batch.get_total_buffer_size()
        # Binary-counter merging keeps O(log n) chunks; each row is copied O(log n) times.
        # The chunks a cascade of pairwise merges would join are joined in one concat.
        first, rows = len(self.chunks) - 1, batch.num_rows
        while first > 0 and rows >= self.chunks[first - 1].num_rows:
            first -= 1
            rows += self.chunks[first].num_rows
        if first < len(self.chunks) - 1:
            parts = self.chunks[first:]
            merged = pa.concat_batches(parts)
            self._bytes += merged.get_total_buffer_size() - sum(
                p.get_total_buffer_size() for p in parts)
            del self.chunks[first + 1:], self.starts[first + 1:]
            self.chunks[first] = merged
        return start

    def take(self, ids: np.ndarray) -> pa.RecordBatch:
        """Rows by global id, in the order given. Chunks of a small state are joined into
        one first, as the joined take would join them: the next reads, until an append,
        are a take from one chunk."""
        if (len(ids) and len(self.chunks) > 1
                and self.next_id - self.starts[0] <= JOINED_TAKE_MAX_ROWS):
            joined = pa.concat_batches(self.chunks)
            self._bytes = joined.get_total_buffer_size()
            self.chunks, self.starts = [joined], [self.starts[0]]
        return take(self.schema, self.chunks, self.starts, ids)

    def keep_only(self, ids: np.ndarray) -> None:
        """Rewrites the rows of these ids (ascending) as one chunk: they are ids 0.. now."""
        rows = self.take(ids)
        self.chunks, self.starts, self.next_id = [rows], [0], rows.num_rows
        self._bytes = rows.get_total_buffer_size()

    def frozen(self, ids: np.ndarray) -> "FrozenRows":
        """The rows of these ids (ascending), readable from another thread while these
        change (chunks are immutable and the lists are copied)."""
        return FrozenRows(self.schema, list(self.chunks), list(self.starts), ids)

    def nbytes(self) -> int:
        return self._bytes


class FrozenRows:
    """A consistent view of the live rows at one moment, in row-id order."""

    def __init__(self, schema: pa.Schema, chunks: list, starts: list, ids: np.ndarray):
        self.schema, self._chunks, self._starts, self._ids = schema, chunks, starts, ids

    def batches(self, batch_size: int) -> Iterator[pa.RecordBatch]:
        ids = self._ids
        for lo in range(0, len(ids), max(1, batch_size)):
            yield take(self.schema, self._chunks, self._starts, ids[lo:lo + batch_size])


# chunks of at most this many rows in all are read by one Arrow take over them (which joins
# them first: about 2 us a thousand rows), not a take per chunk and one more for the order
# (about 15 us each, as long as a small state's whole read); a bound, so a read's cost
# never grows with a large state
JOINED_TAKE_MAX_ROWS = 8192


def take(schema: pa.Schema, chunks: Sequence[pa.RecordBatch], starts: Sequence[int],
         ids: np.ndarray) -> pa.RecordBatch:
    """Rows by global id from these chunks, in the order given."""
    if len(ids) and len(chunks) == 1:
        return chunks[0].take(pa.array(ids - starts[0] if starts[0] else ids))
    if len(ids) and starts[-1] + chunks[-1].num_rows - starts[0] <= JOINED_TAKE_MAX_ROWS:
        joined = pa.Table.from_batches(chunks, schema)
        return joined.take(pa.array(ids - starts[0] if starts[0] else ids)).combine_chunks(
            ).to_batches()[0]
    return take_by_id(schema, starts, ids,
                      lambda c, positions: chunks[c].take(pa.array(positions)))


def take_by_id(schema: pa.Schema, starts: Sequence[int], ids: np.ndarray,
               rows_at: Callable[[int, np.ndarray], pa.RecordBatch]) -> pa.RecordBatch:
    """Rows by global id from consecutive parts (part c's first row has id starts[c]), in
    the order given; `rows_at(c, positions)` reads part c's rows at sorted positions."""
    if len(ids) == 0:
        return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema],
                                          schema=schema)
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    starts = np.asarray(starts, dtype=np.int64)
    part_of = np.searchsorted(starts, sorted_ids, side="right") - 1
    bounds = np.searchsorted(part_of, np.arange(len(starts) + 1))
    parts = [rows_at(c, sorted_ids[lo:hi] - starts[c])
             for c, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])) if lo < hi]
    rows = parts[0] if len(parts) == 1 else pa.concat_batches(parts)
    if np.any(order[1:] < order[:-1]):
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        rows = rows.take(pa.array(inverse))
    return rows
