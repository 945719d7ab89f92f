"""Real-time mode (`trigger(realTime=...)`) in tests: Spark's low-latency memory source fed
from Python, a sink in the JVM that records each output row as it comes, and the per-row state
functions whose outputs per key do not depend on how rows are cut into calls (the oracle is
the same function in micro-batch mode: only when rows are emitted may differ)."""
import json
import os

import pandas as pd
from pyspark.sql import DataFrame, Row
from pyspark.sql.streaming import DataStreamWriter
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

# the columns every test query reads: a key and a value increasing per key
INPUT = "user string, v long"
OUTPUT = "user string, v long, n long, total long"


class LowLatencySource:
    """Spark's LowLatencyMemoryStream (the test source of Spark's own real-time suites; a
    Python query reads it through py4j): rows `user:v`, parsed to INPUT's columns. One
    object serves a query's restarts, as its offsets are in the checkpoint."""

    def __init__(self, spark, partitions: int = 1) -> None:
        jvm = spark._jvm
        self._jvm, self._gateway = jvm, spark.sparkContext._gateway
        self.stream = jvm.org.apache.spark.sql.execution.streaming.sources \
            .LowLatencyMemoryStream.apply(spark._jsparkSession, partitions,
                                          jvm.org.apache.spark.sql.Encoders.STRING())
        parts = F.split(F.col("value"), ":")
        self.df = DataFrame(self.stream.toDF(), spark).select(
            parts[0].alias("user"), parts[1].cast("long").alias("v"))

    def add(self, rows) -> None:
        from py4j.java_collections import ListConverter
        items = ListConverter().convert([f"{u}:{v}" for u, v in rows],
                                        self._gateway._gateway_client)
        self.stream.addData(self._jvm.org.apache.spark.api.python.PythonUtils.toSeq(items))


class RecordingSink:
    """A foreach sink (allowed in real-time mode) in the session's JVM, writing each output
    row with the time it reached the sink (`at`, epoch seconds) as a JSON line
    (tests/jvm/ArrivalRecorder.scala, in the test jar): PySpark's own foreach sink would see
    a real-time batch's rows only at the batch's end."""

    def __init__(self, path: str) -> None:
        self.path = path

    def writer(self, df: DataFrame) -> DataStreamWriter:
        """`df.writeStream` into this sink."""
        writer = df.writeStream
        writer._jwrite.foreach(df.sparkSession._jvm.org.apache.spark.sql.arrowstate.testing
                               .ArrivalRecorder(self.path))
        return writer

    def rows(self) -> list[dict]:
        if not os.path.exists(self.path):
            return []
        with open(self.path) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]


def per_key(rows) -> dict:
    """Output rows as (v, n, total) sequences per key, in order of v."""
    out: dict = {}
    for r in rows:
        r = r if isinstance(r, dict) else r.asDict()
        out.setdefault(r["user"], []).append((r["v"], r["n"], r["total"]))
    return {k: sorted(v) for k, v in out.items()}


# -- the state functions: per row, the key's count and total so far -------------------------

def _running(key, pdfs, n: int, total: int):
    """A key's rows, in order of v, each with the key's count and total after it; the new
    count and total."""
    frame = pd.concat(list(pdfs)).sort_values("v")
    ns, totals = [], []
    for v in frame["v"]:
        n, total = n + 1, total + v
        ns.append(n)
        totals.append(total)
    out = pd.DataFrame({"user": key[0], "v": frame["v"].values, "n": ns, "total": totals})
    return out, n, total


def running_total(key, pdfs, state):
    """applyInPandasWithState: one output row per input row, rows taken in order of v."""
    out, n, total = _running(key, pdfs, *(state.get if state.exists else (0, 0)))
    state.update((n, total))
    yield out


class RunningTotal(StatefulProcessor):
    """transformWithStateInPandas: running_total with a ValueState."""

    def init(self, handle):
        self.state = handle.getValueState("state", "n long, total long")

    def handleInputRows(self, key, rows, timerValues):
        out, n, total = _running(key, rows,
                                 *(self.state.get() if self.state.exists() else (0, 0)))
        self.state.update((n, total))
        yield out


class RunningTotalRows(StatefulProcessor):
    """transformWithState (Row API): running_total with a ValueState."""

    def init(self, handle):
        self.state = handle.getValueState("state", "n long, total long")

    def handleInputRows(self, key, rows, timerValues):
        n, total = self.state.get() if self.state.exists() else (0, 0)
        for row in sorted(rows, key=lambda r: r.v):
            n, total = n + 1, total + row.v
            yield Row(user=key[0], v=row.v, n=n, total=total)
        self.state.update((n, total))


class ExpiresAfter(StatefulProcessor):
    """transformWithState (Row API), ProcessingTime: echoes each row and sets a timer 300 ms
    after a key's first row (by the processor's clock); when it fires, emits `expired` with
    the time the timer was set for and clears the key's state."""

    def init(self, handle):
        self.handle = handle
        self.due = handle.getValueState("due", "ms long")

    def handleInputRows(self, key, rows, timerValues):
        for row in rows:
            yield Row(user=key[0], v=row.v, kind="row")
        if not self.due.exists():
            due = timerValues.getCurrentProcessingTimeInMs() + 300
            self.handle.registerTimer(due)
            self.due.update((due,))

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        due = expiredTimerInfo.getExpiryTimeInMs()
        self.due.clear()
        yield Row(user=key[0], v=due, kind="expired")
