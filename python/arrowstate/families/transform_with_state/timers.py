"""transformWithState's timers.

Timers (time modes ProcessingTime and EventTime) as pyspark's worker runs them: after
every key's rows, each timer at or before the batch's timestamp (ProcessingTime) or the
eviction watermark (EventTime) expires in timestamp order, handleExpiredTimer is called
with the key as a Row, then the timer is deleted (counted in numDeletedTimers, as Spark
counts it; Spark's Python path leaves numExpiredTimers at 0). Expiry pops a heap: it costs
what expires. On the tier the heap is a `TimeIndex` of grouping keys (see working_set).
"""
from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any, Iterator

import pyarrow as pa

from ...spark_state.transform_with_state import TIMER_VARIABLE
from .kinds import TIMERS
from .variables import SEQUENCE

if TYPE_CHECKING:
    from .family import TransformWithState


class Timers:
    """The timers of every grouping key: `data` (key -> sorted expiry times, stored as the
    `$timers` variable) and a heap of (time, sequence, key) over them for expiry. Deleted
    timers stay in the heap until popped (skipped then) or until the heap is rebuilt, which
    happens when stale entries outnumber live ones."""

    kind, name, ttl = TIMERS, TIMER_VARIABLE, None

    def __init__(self, family: "TransformWithState") -> None:
        self.family = family
        self.type = pa.list_(pa.int64())
        self.data: dict = {}
        self.heap: list = []
        self.live = 0
        self.index = None          # on the tier: TimeIndex of (time, grouping key)
        self.pending: list = []    # on the tier: this batch's new (time, grouping key)
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

    def attach_tier(self, data: dict, index) -> None:
        """Takes the loaded keys' timers (filled as keys load) and the index of all."""
        self.data, self.index = data, index

    def flush(self) -> None:
        """Indexes the timers registered since the last flush (on the tier)."""
        self.family.working.index(self.index, self.pending)

    def _rebuild(self) -> None:
        self.heap[:] = [(ts, next(SEQUENCE), g) for g, times in self.data.items()
                        for ts in times]
        heapq.heapify(self.heap)

    def register(self, ts: int) -> None:
        family = self.family
        group = family.current_key()
        times = self.data.setdefault(group, [])
        family.metrics["numRegisteredTimers"] += 1
        if ts in times:
            return   # Spark logs a warning and keeps the one timer
        times.append(ts)
        times.sort()
        self.dirty[group] = None
        if self.index is not None:
            self.pending.append((ts, group))
            return
        self.live += 1
        heapq.heappush(self.heap, (ts, next(SEQUENCE), group))

    def delete(self, ts: int, group=None) -> None:
        family = self.family
        group = family.current_key() if group is None else group
        family.metrics["numDeletedTimers"] += 1   # counted whether or not it existed
        times = self.data.get(group)
        if not times or ts not in times:
            return
        times.remove(ts)
        if not times:
            del self.data[group]
        self.live -= 1
        self.dirty[group] = None
        if self.index is None and len(self.heap) > 2 * self.live + 1024:
            self._rebuild()

    def list(self) -> Iterator[int]:
        return iter(list(self.data.get(self.family.current_key(), ())))

    def expired(self, threshold: int) -> list[tuple[int, Any]]:
        """Live timers at or before `threshold`, in time order, taken off the heap at once:
        as Spark's iterator over its timer index, one made before any handler runs."""
        heap, due, seen = self.heap, [], set()
        if self.index is not None:   # the keys come due loaded
            self.flush()
            entries = zip(*self.family.working.due(self.index, threshold))
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
