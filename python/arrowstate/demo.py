"""`python -m arrowstate demo`: two short stateful queries on local Spark.

1. dropDuplicates then a windowed count (deduplication and aggregation, update mode);
2. applyInPandasWithState keeping a running total of clicks per user.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import tempfile


def running_clicks(key, pdfs, state):
    """applyInPandasWithState function of the demo: clicks per user so far."""
    import pandas as pd

    total = state.get[0] if state.exists else 0
    for pdf in pdfs:
        total += int(pdf["clicks"].sum())
    state.update((total,))
    yield pd.DataFrame({"user": [key[0]], "total_clicks": [total]})


def run_demo() -> None:
    from pyspark.sql import SparkSession

    import arrowstate

    spark = arrowstate.configure(
        SparkSession.builder.master("local[2]").appName("arrowstate-demo")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    workdir = tempfile.mkdtemp(prefix="arrowstate-demo-")
    try:
        _show(spark, workdir)
    finally:   # the demo's input and checkpoints are its own: nothing is left behind
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _show(spark, workdir: str) -> None:
    """Runs the two queries over three micro-batches, printing each one's new rows, then
    their EXPLAIN and state figures."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    source = os.path.join(workdir, "in")
    os.makedirs(source)
    schema = pa.schema([("user", pa.string()), ("ts", pa.timestamp("us", tz="UTC")),
                        ("clicks", pa.int64())])

    def at(second: int) -> dt.datetime:
        return dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=second)

    micro_batches = [
        [("ann", 0, 1), ("bob", 1, 1), ("ann", 0, 1)],           # ann's repeat is dropped
        [("ann", 0, 2), ("cid", 30, 1), ("bob", 2, 1)],          # watermark moves to 20 s
        [("dan", 5, 1), ("eve", 31, 1), ("cid", 30, 9)],         # dan is late; cid repeats
    ]
    stream = (spark.readStream.schema("user string, ts timestamp, clicks long")
              .option("maxFilesPerTrigger", 1).parquet(source))
    queries = {
        "deduplicated_window_counts": (
            stream.withWatermark("ts", "10 seconds").dropDuplicates(["user", "ts"])
            .groupBy(F.window("ts", "10 seconds")).agg(F.count("*").alias("events"))
            .select(F.col("window.start").alias("window_start"), "events")),
        "running_clicks": stream.groupBy("user").applyInPandasWithState(
            running_clicks, "user string, total_clicks long", "total long", "Update",
            GroupStateTimeout.NoTimeout),
    }
    started = {name: df.writeStream.format("memory").queryName(name).outputMode("update")
               .option("checkpointLocation", os.path.join(workdir, name)).start()
               for name, df in queries.items()}
    seen = dict.fromkeys(queries, 0)
    for i, rows in enumerate(micro_batches):
        table = pa.Table.from_pylist(
            [{"user": u, "ts": at(s), "clicks": c} for u, s, c in rows], schema=schema)
        pq.write_table(table, os.path.join(source, f"{i:03d}.parquet"))
        print(f"\n-- micro-batch {i}: input {rows}")
        for name, query in started.items():
            query.processAllAvailable()
            out = spark.sql(f"select * from {name}").collect()
            print(f"   {name}: new output rows {[tuple(r) for r in out[seen[name]:]]}")
            seen[name] = len(out)
    for name, query in started.items():
        print(f"\n-- EXPLAIN {name}")
        query.explain()
        print(f"-- {name}: lastProgress.stateOperators")
        for op in query.lastProgress["stateOperators"]:
            print(json.dumps(op))
        query.stop()
