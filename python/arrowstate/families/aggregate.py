"""Streaming aggregation state, as Spark's StateStoreRestoreExec + StateStoreSaveExec pair.

Spark's own merge aggregate runs in the JVM between the two; this family only keeps each
group's aggregation buffer, as Spark's StateStoreSaveExec keeps it:
- lookup (restore): for a batch of group keys, the stored buffers of those that have one;
- process (save): late rows (event time at or below the late-events watermark, append and
  update modes) are dropped and counted, the rest are stored;
- finish: complete mode emits every stored row; append mode removes and emits the groups
  the eviction watermark closed; update mode removes them without output.
Buffers stay Arrow end to end: the worker never converts a value to Python.
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from .. import keys as keycodec
from .. import protocol
from ..spark_state.aggregate import LAYOUT
from ..store.versions.versioned import VersionedState
from .base import WATERMARK_METRICS, FamilyBase


class Aggregate(FamilyBase):
    name = "aggregate"
    layout = LAYOUT
    tiered = True
    hashed_keys = True

    def __init__(self, operator: dict[str, Any], input_schema: pa.Schema):
        super().__init__(operator, WATERMARK_METRICS)
        self.key_count = operator["keyCount"]
        self.output_mode = operator["outputMode"]
        self.event_time_index = operator["eventTimeIndex"]   # among the keys, or -1
        self.batch_size = max(1, int(operator["batchSize"]))
        self.indexed = self.event_time_index >= 0 and self.output_mode != "complete"
        if not self.indexed:   # Spark drops and evicts nothing then
            self.late_threshold = self.evict_threshold = None
        fields = list(input_schema)
        self.key_fields, self.value_fields = fields[: self.key_count], fields[self.key_count:]

    def index_rows(self, state: VersionedState, keys: list, rows: pa.RecordBatch) -> None:
        """Indexes groups by the event time that closes them (a window's end)."""
        if self.indexed:
            times, valid = keycodec.event_time_micros(rows.column(self.event_time_index))
            state.index.add_many(times, keys, valid)

    def lookup(self, state: VersionedState, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        """Positions of the keys that have a stored buffer, with that buffer. Groups seen for
        the first time are indexed here, where their absence is already known (a group
        dropped as late afterwards leaves an entry that eviction skips)."""
        with self.updating():
            row_keys = state.keys(batch.columns, batch.num_rows)
            ids = state.lookup(row_keys)
            new = np.flatnonzero(ids < 0)
            if len(new) and self.indexed:
                self.index_rows(state, state.pick(row_keys, new), batch.take(pa.array(new)))
            found = np.flatnonzero(ids >= 0)
            if not len(found):
                return None
            stored = state.take(ids[found])
            return pa.RecordBatch.from_arrays(
                [pa.array(found.astype(np.int32))] + stored.columns[self.key_count:],
                names=["pos"] + [f"v{i}" for i in range(len(self.value_fields))])

    def process(self, state: VersionedState, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        """Stores the batch's rows; answers with a keep-mask only when some rows were late."""
        with self.updating():
            mask = None
            if self.late_threshold is not None:
                late = self.late_mask(
                    *keycodec.event_time_micros(batch.column(self.event_time_index)))
                if late.any():
                    mask = pa.array(~late, pa.bool_())
                    batch = batch.filter(mask)
            state.put_rows(state.keys(batch.columns[: self.key_count], batch.num_rows),
                           batch)
            self.metrics["numUpdatedStateRows"] += batch.num_rows
        if mask is None or self.output_mode != "update":
            return None
        return protocol.mask_batch(mask)

    def finish(self, state: VersionedState) -> Iterator[pa.RecordBatch]:
        self.close_timings()
        if self.output_mode == "complete":
            yield from state.all_rows(self.batch_size)
            return
        with self.removing():
            evicted = self.expire(state)
        self.close_timings()
        if evicted is not None and self.output_mode == "append":
            for lo in range(0, evicted.num_rows, self.batch_size):
                yield evicted.slice(lo, self.batch_size)
