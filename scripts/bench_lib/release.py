"""bench.py --release: memory given back when queries stop. The resident memory of this
Spark's state workers (summed) once a small query has started them, at its peak while a
transformWithStateInPandas count per key runs over --release-keys keys (one batch of new
keys per --batch-rows), right after the query stops, and one maintenance interval later
(spark.sql.streaming.stateStore.maintenanceInterval: by then the stopped query's state is
dropped and its function workers have exited), with the workers left each time."""
from __future__ import annotations

import json
import shutil
import tempfile
import time


def _workers() -> tuple[int, int]:
    """How many of this Spark's state workers run, and their resident memory in MB."""
    from procinfo import own_state_worker_pids, rss_bytes
    pids = own_state_worker_pids()
    return len(pids), round(sum(map(rss_bytes, pids)) / 2**20)


def release(spark, args, case, write_batches) -> None:
    from bench_lib.scaling import PeakRss
    build, _ = case
    interval_s = spark.sparkContext._jvm.org.apache.spark.util.Utils.timeStringAsSeconds(
        spark.conf.get("spark.sql.streaming.stateStore.maintenanceInterval", "60s"))

    def run(source: str) -> None:
        checkpoint = tempfile.mkdtemp(prefix="bench-ck-")
        try:
            stream = (spark.readStream.schema("key long, value double")
                      .option("maxFilesPerTrigger", 1).parquet(source))
            q = (build(stream).writeStream.format("noop").outputMode("update")
                 .trigger(availableNow=True).option("checkpointLocation", checkpoint).start())
            q.awaitTermination()
        finally:
            shutil.rmtree(checkpoint, ignore_errors=True)

    small, big = tempfile.mkdtemp(prefix="bench-small-"), tempfile.mkdtemp(prefix="bench-big-")
    try:
        write_batches(small, 1000, 1000)
        write_batches(big, args.release_keys, args.batch_rows)
        run(small)   # the workers a session starts with
        time.sleep(interval_s + 2)   # the small query's state dropped: the workers as at start
        start = _workers()
        peak = PeakRss()
        run(big)
        memory = peak.stop()
        stopped = _workers()
        time.sleep(interval_s + 2)
        later = _workers()
        print(json.dumps({
            "case": "release", "keys": args.release_keys,
            "maintenance_interval_s": interval_s,
            "workers_at_start": start[0], "rss_at_start_mb": start[1],
            "worker_rss_peak_mb": memory["worker_rss_peak_mb"], "workers_in_run": memory["workers"],
            "workers_at_stop": stopped[0], "rss_at_stop_mb": stopped[1],
            "workers_one_interval_later": later[0], "rss_one_interval_later_mb": later[1],
            "within_20_percent_of_start": later[1] <= 1.2 * start[1]}), flush=True)
    finally:
        shutil.rmtree(small, ignore_errors=True)
        shutil.rmtree(big, ignore_errors=True)
