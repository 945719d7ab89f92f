"""The floor of bench.py's user-function cases: the same user function over the same
micro-batches, grouped as the operator groups them, in plain Python with no engine. Per
batch and shuffle partition: sort the partition's rows by key, convert the columns once
(to pandas, or to Python values), find each key's rows, hand them over (a DataFrame slice,
or Rows), keep the state in dicts, gather the outputs into one Arrow table. Python values
and Rows are made as cheaply as arrowstate makes them (its own python_column and
row_class), and Python's garbage collector runs as in arrowstate's workers (GC_THRESHOLDS),
so the floor is no slower for want of a trick the engine has.

What the floor leaves to the engine around it (reading the files and the shuffle) is timed
by Spark itself: the same stream repartitioned by key into a no-op sink. The floor's time
is that plus, per batch, the partitions' Python time spread over the cores (each partition
runs on one core, the longest first: `makespan`).
"""
from __future__ import annotations

import functools
import gc
import glob
import heapq
import itertools
import os
import statistics
import time
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

WATERMARK_DELAY_MS = 10_000   # the timer case's withWatermark("ts", "10 seconds")


class _Value:
    def __init__(self, handle) -> None:
        self.handle, self.data = handle, {}

    def exists(self):
        return self.handle.key in self.data

    def get(self):
        return self.data.get(self.handle.key)

    def update(self, value):
        self.data[self.handle.key] = value

    def clear(self):
        self.data.pop(self.handle.key, None)


class _List(_Value):
    def get(self):
        return iter(self.data.get(self.handle.key, ()))

    def put(self, values):
        self.data[self.handle.key] = list(values)

    def appendValue(self, value):
        self.data.setdefault(self.handle.key, []).append(value)

    def appendList(self, values):
        self.data.setdefault(self.handle.key, []).extend(values)


class _Map(_Value):
    def getValue(self, key):
        entries = self.data.get(self.handle.key)
        return None if entries is None else entries.get(key)

    def containsKey(self, key):
        return key in self.data.get(self.handle.key, ())

    def updateValue(self, key, value):
        entries = self.data.get(self.handle.key)
        if entries is None:
            entries = self.data[self.handle.key] = {}
        entries[key] = value

    def removeKey(self, key):
        self.data.get(self.handle.key, {}).pop(key, None)

    def iterator(self):
        return iter(list(self.data.get(self.handle.key, {}).items()))


class _Handle:
    """A StatefulProcessorHandle over dicts; event-time timers in a heap."""

    def __init__(self) -> None:
        self.key = None
        self.timers: dict = {}   # key -> its timers
        self.heap: list = []     # (time, sequence, key), deleted ones skipped when due
        self.sequence = itertools.count()

    def getValueState(self, name, schema, ttlDurationMs=None):
        return _Value(self)

    def getListState(self, name, schema, ttlDurationMs=None):
        return _List(self)

    def getMapState(self, name, key_schema, value_schema, ttlDurationMs=None):
        return _Map(self)

    def registerTimer(self, ms):
        self.timers.setdefault(self.key, set()).add(ms)
        heapq.heappush(self.heap, (ms, next(self.sequence), self.key))

    def deleteTimer(self, ms):
        mine = self.timers.get(self.key)
        if mine is not None:
            mine.discard(ms)
            if not mine:
                del self.timers[self.key]

    def listTimers(self):
        return iter(list(self.timers.get(self.key, ())))

    def due(self, watermark_ms: int):
        """(time, key) of each timer at or before the watermark, removed."""
        while self.heap and self.heap[0][0] <= watermark_ms:
            ms, _, key = heapq.heappop(self.heap)
            mine = self.timers.get(key)
            if mine is not None and ms in mine:
                mine.discard(ms)
                if not mine:
                    del self.timers[key]
                yield ms, key


class _GroupState:
    """applyInPandasWithState's GroupState over a dict (no timeout)."""

    def __init__(self) -> None:
        self.key, self.data = None, {}

    @property
    def exists(self):
        return self.key in self.data

    @property
    def get(self):
        return self.data[self.key]

    def update(self, value):
        self.data[self.key] = value

    def remove(self):
        self.data.pop(self.key, None)


def _bounds(keys: np.ndarray) -> tuple[list, list]:
    starts = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    return [0] + starts.tolist(), starts.tolist() + [len(keys)]


class FloorPartition:
    """One shuffle partition's state and the user function over its batches."""

    def __init__(self, kind: str, function) -> None:
        import pandas as pd
        from pyspark.sql.streaming.stateful_processor import TimerValues
        self.kind, self.pd = kind, pd
        if kind == "apply_in_pandas_with_state":
            self.function, self.state = function, _GroupState()
        else:
            self.processor, self.handle = function(), _Handle()
            self.processor.init(self.handle)
        self.timer_values = TimerValues(-1, -1)

    def batch(self, table: pa.Table, watermark_ms: int | None) -> pa.Table | None:
        from pyspark.sql import Row
        from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues

        from arrowstate.families.transform_with_state.processor_input import (python_column,
                                                                                row_class)
        pd, outputs = self.pd, []
        if watermark_ms is not None:
            self.timer_values = TimerValues(-1, watermark_ms)
        if table is not None and table.num_rows:
            table = table.take(pc.sort_indices(table, [("key", "ascending")]))
            keys = table.column("key").to_numpy()
            key_values = keys.tolist()
            if self.kind == "tws_rows":   # Rows and values made as cheaply as known
                DataRow = row_class(table.column_names, Row)
                columns = [python_column(c.combine_chunks()) for c in table.columns]
                rows = list(map(functools.partial(tuple.__new__, DataRow), zip(*columns)))
            else:
                frame = table.to_pandas()
            for lo, hi in zip(*_bounds(keys)):
                key = (key_values[lo],)
                if self.kind == "tws_rows":
                    items = rows[lo:hi]
                else:
                    chunk = frame.iloc[lo:hi]
                    chunk.index = pd.RangeIndex(hi - lo)
                    items = [chunk]
                if self.kind == "apply_in_pandas_with_state":
                    self.state.key = key
                    outputs.extend(self.function(key, iter(items), self.state))
                else:
                    self.handle.key = key
                    outputs.extend(self.processor.handleInputRows(key, iter(items),
                                                                  self.timer_values))
        if watermark_ms is not None:
            for ms, key in list(self.handle.due(watermark_ms)):
                self.handle.key = key
                outputs.extend(self.processor.handleExpiredTimer(
                    key, self.timer_values, ExpiredTimerInfo(ms)))
        if not outputs:
            return None
        if self.kind == "tws_rows":
            names = outputs[0].__fields__
            return pa.table(dict(zip(names, map(pa.array, zip(*outputs)))))
        return pa.Table.from_pandas(pd.concat(outputs, ignore_index=True),
                                    preserve_index=False)


def _in_zone(table: pa.Table, time_zone: str) -> pa.Table:
    """The table's zoned timestamps in `time_zone` (the same instants)."""
    columns = [c.cast(pa.timestamp(c.type.unit, tz=time_zone))
               if pa.types.is_timestamp(c.type) and c.type.tz is not None else c
               for c in table.columns]
    return pa.table(columns, names=table.column_names)


def makespan(seconds: list[float], cores: int) -> float:
    """The time `cores` cores take for these tasks, each on one core, longest first."""
    loads = [0.0] * cores
    for s in sorted(seconds, reverse=True):
        loads[loads.index(min(loads))] += s
    return max(loads)


def floor_python_seconds(source: str, kind: str, function: Callable, partitions: int,
                         event_time: bool, time_zone: str, cores: int = 2) -> dict:
    """The floor's Python time over every batch file of `source` (each file one
    micro-batch, then, for event time, one batch without data as Spark runs to fire what
    the last watermark makes due): the sum over batches of their partitions' makespan, and
    the median of a steady batch's.
    Timestamps come in the session's time zone (`time_zone`), as Spark hands them to any
    Python function: a function's datetimes carry that zone, and making them costs more in
    some zones than in others (pandas makes UTC's in C, Etc/UTC's at twice the cost)."""
    from arrowstate.worker import GC_THRESHOLDS
    files = sorted(glob.glob(os.path.join(source, "*.parquet")))
    states = [FloorPartition(kind, function) for _ in range(partitions)]
    collecting = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        return _timed_batches(files, states, partitions, event_time, time_zone, cores)
    finally:
        gc.set_threshold(*collecting)


def _timed_batches(files: list[str], states: list[FloorPartition], partitions: int,
                   event_time: bool, time_zone: str, cores: int) -> dict:
    watermark, per_batch = None, []
    for path in files + ([None] if event_time else []):
        table = None if path is None else _in_zone(pq.read_table(path), time_zone)
        spread = (None if table is None else   # the shuffle
                  table.column("key").to_numpy() % partitions)
        times = []
        for p, state in enumerate(states):
            part = None if table is None else table.filter(pa.array(spread == p))
            start = time.perf_counter()
            state.batch(part, watermark)
            times.append(time.perf_counter() - start)
        per_batch.append(makespan(times, cores))
        if event_time and table is not None:   # the next batch's watermark
            latest = pc.max(table.column("ts")).value // 1000
            watermark = latest - WATERMARK_DELAY_MS
    # steady batches as the engines' are counted: after the first, with input rows (not
    # event time's last batch, which only fires timers)
    steady = per_batch[1:len(files)]
    return {"python_s": sum(per_batch), "batches": len(per_batch),
            "steady_batch_s": statistics.median(steady) if steady else per_batch[0]}
