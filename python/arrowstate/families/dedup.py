"""Streaming deduplication, as Spark's StreamingDeduplicateExec and its WithinWatermark twin.

Per partition and micro-batch, as Spark's operator does it:
1. rows whose event time is at or below the late-events watermark are dropped and counted;
2. a row whose key is in state is a duplicate and dropped; otherwise it is output and its
   key stored (for the WithinWatermark variant with `expiresAt = event time + delay`);
3. after all input, keys the eviction watermark closes are removed: by the key's own event
   time, or by `expiresAt` for the WithinWatermark variant.
The worker receives only the key columns (and the event-time column) and answers each batch
with a keep-mask, so rows stay in the JVM.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from .. import keys as keycodec
from .. import protocol
from ..spark_state.dedup import LAYOUT
from ..store.versions.versioned import VersionedState
from .base import WATERMARK_METRICS, FamilyBase


class Deduplicate(FamilyBase):
    name = "deduplicate"
    layout = LAYOUT
    tiered = True
    hashed_keys = True

    def __init__(self, operator: dict[str, Any], input_schema: pa.Schema):
        super().__init__(operator, WATERMARK_METRICS + ("numDroppedDuplicateRows",))
        self.key_count = operator["keyCount"]
        self.event_time_index = operator["eventTimeIndex"]
        self.evict_by_key = operator["evictByKey"]
        self.within_watermark = operator["withinWatermark"]
        self.delay_micros = int(operator.get("delayMs") or 0) * 1000
        if not (self.within_watermark or self.evict_by_key):
            self.evict_threshold = None   # nothing in state carries a time to evict by
        self.key_fields = list(input_schema)[: self.key_count]
        self.value_fields = ([pa.field("expiresAtMicros", pa.int64(), nullable=False)]
                             if self.within_watermark else [])

    def index_rows(self, state: VersionedState, keys: list, rows: pa.RecordBatch) -> None:
        """Indexes stored rows by when they expire (a null event time never does)."""
        if self.within_watermark:
            state.index.add_many(rows.column(self.key_count).to_numpy(zero_copy_only=False),
                                 keys)
        elif self.evict_by_key:  # a window expires with its end
            times, valid = keycodec.event_time_micros(rows.column(self.event_time_index))
            state.index.add_many(times, keys, valid)

    def process(self, state: VersionedState, batch: pa.RecordBatch) -> pa.RecordBatch:
        with self.updating():
            n = batch.num_rows
            keep = np.ones(n, dtype=bool)
            event_micros = valid_time = None
            if self.event_time_index >= 0 and (self.late_threshold is not None
                                               or self.within_watermark):
                event_micros, valid_time = keycodec.event_time_micros(
                    batch.column(self.event_time_index))
            if event_micros is not None:
                late = self.late_mask(event_micros, valid_time)
                if late is not None:
                    keep &= ~late

            row_keys = state.keys(batch.columns[: self.key_count], n)
            candidates = np.flatnonzero(keep)

            def stored_rows(new_rows: np.ndarray) -> pa.RecordBatch:
                columns = [c.take(new_rows) for c in batch.columns[: self.key_count]]
                if self.within_watermark:
                    columns.append(pa.array(event_micros[new_rows] + self.delay_micros,
                                            pa.int64()))
                return pa.RecordBatch.from_arrays(columns, schema=state.schema)

            # each new key's first row, stored
            new_rows, new_keys, stored = state.put_first_absent(row_keys, candidates,
                                                                stored_rows)
            keep[:] = False
            keep[new_rows] = True
            self.index_rows(state, new_keys, stored)
            self.metrics["numUpdatedStateRows"] += len(new_keys)
            self.metrics["numDroppedDuplicateRows"] += len(candidates) - len(new_rows)
        return protocol.mask_batch(keep)

    def finish(self, state: VersionedState) -> list[pa.RecordBatch]:
        with self.removing():
            self.expire(state)
        self.close_timings()
        return []
