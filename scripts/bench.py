"""Benchmarks: the same streaming work with arrowstate off (Spark's operators) and on, in one
process. Prints one JSON line per case: rows/s of each (median of --runs), their ratio, and
memory (JVM heap used after GC, RSS of the arrowstate Python workers).

    python scripts/bench.py [--rows 1000000] [--batches 5] [--keys 50000] [--runs 3]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def write_batches(directory: str, rows: int, batches: int, keys: int, seed: int = 7) -> None:
    rng = np.random.default_rng(seed)
    per_batch = rows // batches
    start = 1_700_000_000_000_000
    for b in range(batches):
        key = rng.integers(0, keys, per_batch)
        ts = start + (b * per_batch + np.arange(per_batch)) * 1000
        table = pa.table({"key": pa.array(key, pa.int64()),
                          "user": pa.array([f"u{k}" for k in key.tolist()]),
                          "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
                          "value": pa.array(rng.random(per_batch))})
        pq.write_table(table, os.path.join(directory, f"{b:05d}.parquet"))


def jvm_heap_used(spark) -> int:
    rt = spark._jvm.java.lang.Runtime.getRuntime()
    spark._jvm.java.lang.System.gc()
    return int(rt.totalMemory() - rt.freeMemory())


CASES = {
    "dedup": lambda df: df.dropDuplicates(["key"]),
    "dedup_watermark": lambda df: df.withWatermark("ts", "10 seconds")
                                    .dropDuplicates(["user", "ts"]),
}


def run_once(spark, source: str, case: str, arrowstate: bool) -> float:
    spark.conf.set("spark.arrowstate.enabled", str(arrowstate).lower())
    checkpoint = tempfile.mkdtemp(prefix="bench-ck-")
    try:
        stream = (spark.readStream.schema("key long, user string, ts timestamp, value double")
                  .option("maxFilesPerTrigger", 1).parquet(source))
        t0 = time.perf_counter()
        q = (CASES[case](stream).writeStream.format("noop").trigger(availableNow=True)
             .option("checkpointLocation", checkpoint).start())
        q.awaitTermination()
        elapsed = time.perf_counter() - t0
        plan = q._jsq.explainInternal(False)
        assert ("ArrowStreamingDeduplicate" in plan) == arrowstate, plan
        return elapsed
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    import arrowstate
    from arrowstate.procinfo import rss_bytes, state_worker_pids

    spark = arrowstate.configure(
        SparkSession.builder.master("local[2]").appName("arrowstate-bench")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "4g")).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    source = tempfile.mkdtemp(prefix="bench-in-")
    write_batches(source, args.rows, args.batches, args.keys)
    try:
        for case in args.cases.split(","):
            run_once(spark, source, case, True)  # warm-up: JIT, worker start
            run_once(spark, source, case, False)
            times = {False: [], True: []}
            for i in range(args.runs):
                for on in ((False, True) if i % 2 == 0 else (True, False)):
                    times[on].append(run_once(spark, source, case, on))
            native = args.rows / statistics.median(times[False])
            ours = args.rows / statistics.median(times[True])
            print(json.dumps({
                "case": case, "rows": args.rows, "batches": args.batches, "keys": args.keys,
                "runs": args.runs,
                "native_rows_per_s": round(native), "arrowstate_rows_per_s": round(ours),
                "ratio": round(ours / native, 3),
                "native_s": [round(t, 2) for t in times[False]],
                "arrowstate_s": [round(t, 2) for t in times[True]],
                "jvm_heap_used_mb": round(jvm_heap_used(spark) / 2**20),
                "python_workers_rss_mb": round(sum(map(rss_bytes, state_worker_pids())) / 2**20),
            }), flush=True)
    finally:
        shutil.rmtree(source, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    main()
