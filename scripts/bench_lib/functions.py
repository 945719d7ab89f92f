"""The user functions of bench.py's user-function cases: each runs as Spark runs it (arrowstate
off), as arrowstate runs it (on), and in the floor (bench_lib/floor.py: plain Python, state in a
dict). bench.py has cloudpickle send this module by value, so the workers need not import it.

Input rows: key long, user string, ts timestamp, value double.
"""
from __future__ import annotations

import pandas as pd
from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import StatefulProcessor


def count_per_key(key, pdfs, state):
    """applyInPandasWithState: a running count per key."""
    n = state.get[0] if state.exists else 0
    for pdf in pdfs:
        n += len(pdf)
    state.update((n,))
    yield pd.DataFrame({"key": [key[0]], "count": [n]})


class PandasCountPerKey(StatefulProcessor):
    """transformWithStateInPandas: a running count per key in a ValueState."""

    def init(self, handle):
        self.count = handle.getValueState("count", "n long")

    def handleInputRows(self, key, rows, timerValues):
        n = self.count.get()[0] if self.count.exists() else 0
        n += sum(len(pdf) for pdf in rows)
        self.count.update((n,))
        yield pd.DataFrame({"key": [key[0]], "count": [n]})


class RowCountPerKey(StatefulProcessor):
    """transformWithState (Row API): a running count per key in a ValueState."""

    def init(self, handle):
        self.count = handle.getValueState("count", "n long")

    def handleInputRows(self, key, rows, timerValues):
        n = self.count.get()[0] if self.count.exists() else 0
        n += sum(1 for _ in rows)
        self.count.update((n,))
        yield Row(key=key[0], count=n)


def _bucket(value: float) -> tuple:
    """A row's map key: its value's tenth (ten entries per key)."""
    return (int(value * 10),)


class PandasCountPerBucket(StatefulProcessor):
    """transformWithStateInPandas: a MapState entry read and written per input row (a count
    per key and bucket); the key's rows seen in this call go out."""

    def init(self, handle):
        self.counts = handle.getMapState("counts", "bucket long", "n long")

    def handleInputRows(self, key, rows, timerValues):
        counts, seen = self.counts, 0
        for pdf in rows:
            for value in pdf["value"].tolist():
                bucket = _bucket(value)
                n = counts.getValue(bucket)
                counts.updateValue(bucket, (1 if n is None else n[0] + 1,))
            seen += len(pdf)
        yield pd.DataFrame({"key": [key[0]], "count": [seen]})


class RowCountPerBucket(StatefulProcessor):
    """transformWithState (Row API): a MapState entry read and written per input row."""

    def init(self, handle):
        self.counts = handle.getMapState("counts", "bucket long", "n long")

    def handleInputRows(self, key, rows, timerValues):
        counts, seen = self.counts, 0
        for row in rows:
            bucket = _bucket(row.value)
            n = counts.getValue(bucket)
            counts.updateValue(bucket, (1 if n is None else n[0] + 1,))
            seen += 1
        yield Row(key=key[0], count=seen)


class CollectUntilQuiet(StatefulProcessor):
    """transformWithStateInPandas, EventTime: each key's values are appended to a ListState
    and an event-time timer is set 10 s after its latest row (the previous one deleted);
    when it fires the key reports its list's length and is cleared."""

    def init(self, handle):
        self.handle = handle
        self.values = handle.getListState("values", "value double")

    def handleInputRows(self, key, rows, timerValues):
        latest = None
        for pdf in rows:
            self.values.appendList(list(zip(pdf["value"].tolist())))
            top = pdf["ts"].max()
            latest = top if latest is None or top > latest else latest
        for old in list(self.handle.listTimers()):
            self.handle.deleteTimer(old)
        self.handle.registerTimer(int(latest.timestamp() * 1000) + 10_000)
        return iter(())

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        n = sum(1 for _ in self.values.get())
        self.values.clear()
        yield pd.DataFrame({"key": [key[0]], "count": [n]})


def as_they_are(batches):
    """A mapInArrow function that returns its input: Spark's own trip to Python and back."""
    yield from batches


# -- the real-time benchmark's workload (SPARK-58884): per record, the key's ValueState read
# and updated, and one output row with the record's sequence number ---------------------

class RowLatencyCount(StatefulProcessor):
    """transformWithState (Row API): one row per input row, the key's count after it."""

    def init(self, handle):
        self.count = handle.getValueState("count", "n long")

    def handleInputRows(self, key, rows, timerValues):
        for row in rows:
            n = (self.count.get()[0] if self.count.exists() else 0) + 1
            self.count.update((n,))
            yield Row(key=key[0], seq=row.seq, count=n)


class PandasLatencyCount(StatefulProcessor):
    """transformWithStateInPandas: one row per input row, the key's count after it (the
    state read and written once per call, as a pandas function does its rows at once)."""

    def init(self, handle):
        self.count = handle.getValueState("count", "n long")

    def handleInputRows(self, key, rows, timerValues):
        frame = pd.concat(list(rows))
        n = self.count.get()[0] if self.count.exists() else 0
        counts = range(n + 1, n + 1 + len(frame))
        self.count.update((n + len(frame),))
        yield pd.DataFrame({"key": key[0], "seq": frame["seq"].values,
                            "count": list(counts)})
