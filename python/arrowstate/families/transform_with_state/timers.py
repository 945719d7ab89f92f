"""transformWithState's timers.

Timers (time modes ProcessingTime and EventTime) as pyspark's worker runs them: after
every key's rows, each timer at or before the batch's timestamp (ProcessingTime) or the
eviction watermark (EventTime) expires in timestamp order, handleExpiredTimer is called
with the key as a Row, then the timer is deleted (counted in numDeletedTimers, as Spark
counts it; Spark's Python path leaves numExpiredTimers at 0). Expiry pops a heap: it costs
what expires. On the tier the heap is an index of grouping keys (working_set.KeyTimeIndex).
"""
from __future__ import annotations

import heapq
from typing import Any, Iterator

import pyarrow as pa

from ...spark_state.transform_with_state import TIMER_VARIABLE
from .context import OperationContext
from .kinds import TIMERS
from .variables import SEQUENCE


class Timers:
    """The timers of every grouping key: `data` (key -> sorted expiry times, stored as the
    `$timers` variable) and a heap of (time, sequence, key) over them for expiry. Deleted
    timers stay in the heap until popped (skipped then) or until the heap is rebuilt, which
    happens when stale entries outnumber live ones. `context`: the key being processed
    and the metrics its timers count in."""

    kind, name, ttl = TIMERS, TIMER_VARIABLE, None

    def __init__(self, context: OperationContext) -> None:
        self.context = context
        self.type = pa.list_(pa.int64())
        self.data: dict = {}
        self.heap: list = []
        self.live = 0
        self.tier = None           # on the tier: KeyTimeIndex of (time, grouping key)
        self.dirty: dict = {}      # grouping keys whose timers changed this batch

    def take_changes(self) -> dict:
        """The grouping keys whose timers changed this batch (`dirty`), handed over at its
        end."""
        dirty, self.dirty = self.dirty, {}
        return dirty

    def entries_of(self, _value) -> int:
        return 0   # timers are not state rows in Spark's figures

    def attach(self, data: dict, heap: list) -> None:
        """Takes the partition's timers; `heap` is the list kept with them between batches
        (empty after a load from files: then it is built here)."""
        self.data, self.heap = data, heap
        self.live = sum(map(len, data.values()))
        if len(heap) < self.live:
            self._rebuild()

    def attach_tier(self, data: dict, tier) -> None:
        """Takes the loaded keys' timers (filled as keys load) and the index of all
        (working_set.KeyTimeIndex)."""
        self.data, self.tier = data, tier

    def _rebuild(self) -> None:
        self.heap[:] = [(ts, next(SEQUENCE), g) for g, times in self.data.items()
                        for ts in times]
        heapq.heapify(self.heap)

    def register(self, ts: int) -> None:
        group = self.context.key()
        times = self.data.setdefault(group, [])
        self.context.metrics["numRegisteredTimers"] += 1
        if ts in times:
            return   # Spark logs a warning and keeps the one timer
        times.append(ts)
        times.sort()
        self.dirty[group] = None
        if self.tier is not None:
            self.tier.pending.append((ts, group))
            return
        self.live += 1
        heapq.heappush(self.heap, (ts, next(SEQUENCE), group))

    def delete(self, ts: int, group=None) -> None:
        group = self.context.key() if group is None else group
        self.context.metrics["numDeletedTimers"] += 1   # counted whether or not it existed
        times = self.data.get(group)
        if not times or ts not in times:
            return
        times.remove(ts)
        if not times:
            del self.data[group]
        self.live -= 1
        self.dirty[group] = None
        if self.tier is None and len(self.heap) > 2 * self.live + 1024:
            self._rebuild()

    def list(self) -> Iterator[int]:
        return iter(list(self.data.get(self.context.key(), ())))

    def expired(self, threshold: int) -> list[tuple[int, Any]]:
        """Live timers at or before `threshold`, in time order, taken off the heap at once:
        as Spark's iterator over its timer index, one made before any handler runs."""
        heap, due, seen = self.heap, [], set()
        if self.tier is not None:   # the keys come due loaded
            entries = zip(*self.tier.due(threshold))
        else:
            entries = _popped(heap, threshold)
        for ts, group in entries:
            if (ts, group) not in seen and ts in self.data.get(group, ()):
                seen.add((ts, group))
                due.append((ts, group))
        return due


def _popped(heap: list, threshold: int) -> Iterator[tuple[int, Any]]:
    while heap and heap[0][0] <= threshold:
        ts, _, group = heapq.heappop(heap)
        yield ts, group
