"""Streaming aggregation state, as Spark's StateStoreRestoreExec + StateStoreSaveExec pair.

Spark's own merge aggregate runs in the JVM between the two; this family only keeps each
group's aggregation buffer (see shared/reference/StateStoreSaveExec.md):
- lookup (restore): for a batch of group keys, the stored buffers of those that have one;
- process (save): late rows (event time at or below the late-events watermark, append and
  update modes) are dropped and counted, the rest are stored;
- finish: complete mode emits every stored row; append mode removes and emits the groups
  the eviction watermark closed; update mode removes them without output.
Buffers stay Arrow end to end: the worker never converts a value to Python.
"""
from __future__ import annotations

import time
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from . import keys as keycodec
from . import protocol
from .store import VersionedState

class Aggregate:
    family = "aggregate"

    def __init__(self, operator: dict[str, Any], input_schema: pa.Schema):
        self.key_count = operator["keyCount"]
        self.output_mode = operator["outputMode"]
        self.event_time_index = operator["eventTimeIndex"]   # among the keys, or -1
        self.batch_size = max(1, int(operator["batchSize"]))
        watermarked = self.event_time_index >= 0 and self.output_mode != "complete"
        late, evict = operator.get("lateEventsWatermarkMs"), operator.get("evictionWatermarkMs")
        self.late_threshold = late * 1000 if watermarked and late is not None else None
        self.evict_threshold = evict * 1000 if watermarked and evict is not None else None
        fields = list(input_schema)
        self.key_fields, self.value_fields = fields[: self.key_count], fields[self.key_count:]
        self.metrics = {"numUpdatedStateRows": 0, "numRemovedStateRows": 0,
                        "numRowsDroppedByWatermark": 0, "allUpdatesTimeMs": 0,
                        "allRemovalsTimeMs": 0}
        self._update_ns = 0

    # -- state ------------------------------------------------------------------------------
    def _index(self, state: VersionedState, keys: list, rows: pa.RecordBatch) -> None:
        """Indexes groups by the event time that closes them (a window's end)."""
        if self.event_time_index < 0 or self.output_mode == "complete":
            return
        times, valid = keycodec.event_time_micros(rows.column(self.event_time_index))
        state.index.add_many(times, keys, valid)

    def rebuild_index(self, state: VersionedState) -> None:
        self._index(state, list(state.data), state.take(state.live_ids()))

    # -- one micro-batch --------------------------------------------------------------------
    def lookup(self, state: VersionedState, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        """Positions of the keys that have a stored buffer, with that buffer. Groups seen for
        the first time are indexed here, where their absence is already known (a group
        dropped as late afterwards leaves an entry that eviction skips)."""
        start = time.perf_counter_ns()
        row_keys = keycodec.rows(batch.columns, batch.num_rows)
        ids = state.lookup(row_keys)
        new = np.flatnonzero(ids < 0)
        if len(new):
            self._index(state, [row_keys[i] for i in new.tolist()], batch.take(pa.array(new)))
        found = np.flatnonzero(ids >= 0)
        answer = None
        if len(found):
            stored = state.take(ids[found])
            answer = pa.RecordBatch.from_arrays(
                [pa.array(found.astype(np.int32))] + stored.columns[self.key_count:],
                names=["pos"] + [f"v{i}" for i in range(len(self.value_fields))])
        self._update_ns += time.perf_counter_ns() - start
        return answer

    def process(self, state: VersionedState, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        """Stores the batch's rows; answers with a keep-mask only when some rows were late."""
        start = time.perf_counter_ns()
        mask = None
        if self.late_threshold is not None:
            micros, valid = keycodec.event_time_micros(batch.column(self.event_time_index))
            late = valid & (micros <= self.late_threshold)
            dropped = int(late.sum())
            if dropped:
                self.metrics["numRowsDroppedByWatermark"] += dropped
                mask = pa.array(~late, pa.bool_())
                batch = batch.filter(mask)
        state.put_rows(keycodec.rows(batch.columns[: self.key_count], batch.num_rows), batch)
        self.metrics["numUpdatedStateRows"] += batch.num_rows
        self._update_ns += time.perf_counter_ns() - start
        if mask is None or self.output_mode != "update":
            return None
        return protocol.mask_batch(mask)

    def finish(self, state: VersionedState) -> Iterator[pa.RecordBatch]:
        self.metrics["allUpdatesTimeMs"] = self._update_ns // 1_000_000
        if self.output_mode == "complete":
            yield from state.all_rows(self.batch_size)
            return
        start = time.perf_counter_ns()
        evicted = None
        if self.evict_threshold is not None:
            closed, _ = state.index.pop_until(self.evict_threshold)
            evicted = state.pop_present(closed)
            self.metrics["numRemovedStateRows"] += evicted.num_rows
        self.metrics["allRemovalsTimeMs"] = (time.perf_counter_ns() - start) // 1_000_000
        if evicted is not None and self.output_mode == "append":
            for lo in range(0, evicted.num_rows, self.batch_size):
                yield evicted.slice(lo, self.batch_size)
