"""`python -m arrowstate demo`: a short deduplicating query on local Spark."""
from __future__ import annotations

import datetime as dt
import json
import os
import tempfile


def run_demo() -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import SparkSession

    import arrowstate

    spark = arrowstate.configure(
        SparkSession.builder.master("local[2]").appName("arrowstate-demo")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    workdir = tempfile.mkdtemp(prefix="arrowstate-demo-")
    source, checkpoint = os.path.join(workdir, "in"), os.path.join(workdir, "checkpoint")
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
    query = (spark.readStream.schema("user string, ts timestamp, clicks long")
             .option("maxFilesPerTrigger", 1).parquet(source)
             .withWatermark("ts", "10 seconds")
             .dropDuplicates(["user", "ts"])
             .writeStream.format("memory").queryName("deduplicated")
             .option("checkpointLocation", checkpoint).start())
    seen = 0
    for i, rows in enumerate(micro_batches):
        table = pa.Table.from_pylist(
            [{"user": u, "ts": at(s), "clicks": c} for u, s, c in rows], schema=schema)
        pq.write_table(table, os.path.join(source, f"{i:03d}.parquet"))
        query.processAllAvailable()
        out = spark.sql("select * from deduplicated").collect()
        print(f"\n-- micro-batch {i}: input {rows}")
        print(f"   new output rows: {[tuple(r) for r in out[seen:]]}")
        seen = len(out)
    print("\n-- EXPLAIN")
    query.explain()
    print("-- lastProgress.stateOperators")
    for p in query.recentProgress:
        for op in p["stateOperators"]:
            print(f"batch {p['batchId']}: " + json.dumps(op))
    query.stop()
    spark.stop()
