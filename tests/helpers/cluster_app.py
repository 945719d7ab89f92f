"""Runs the differential deduplication case on a standalone cluster (one master, two
workers on loopback), so arrowstate's operator and Python workers run inside executor JVMs
that are not the driver's, with the input and the checkpoints on a store the executors
reach by URI (HDFS or the object store: `where`, JSON of its root URI, Spark settings and
the jars that reach it, shipped to the executors with spark.jars). Started by
test_cluster.py in its own process, since a process holds one SparkContext. Prints one JSON
line with what it saw."""
import datetime as dt
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import pyarrow as pa  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

import arrowstate  # noqa: E402
from procinfo import jvm_pid, parent_command, parent_pid, state_worker_pids  # noqa: E402
import harness  # noqa: E402
from harness import _as_text, run_query, scratch_dir  # noqa: E402


INJECTING = "org.apache.spark.sql.arrowstate.testing.FailureInjectionFileManager"


def main(master: str, test_jar: str, attempt_log: str, where: str) -> None:
    store = json.loads(where)
    spark = arrowstate.configure(
        SparkSession.builder.master(master).appName("arrowstate-cluster-test")
        # to the executors through the driver (no shared path); the driver's own class path
        # has them too, as Hadoop loads a filesystem's class from there
        .config("spark.jars", ",".join([test_jar, *store["jars"]]))
        .config("spark.driver.extraClassPath", os.pathsep.join(store["jars"]))
        .config(map=store["settings"])
        # a task that runs 1.5x the median of the others gets a second attempt elsewhere
        .config("spark.speculation", "true")
        .config("spark.speculation.interval", "100ms")
        .config("spark.speculation.multiplier", "1.5")
        .config("spark.speculation.quantile", "0.5")
        .config("spark.executor.memory", "768m")
        .config("spark.cores.max", "2")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    schema = pa.schema([("user", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))])

    def ev(u, s):
        return {"user": u, "ts": dt.datetime.fromtimestamp(s, dt.timezone.utc)}

    batches = [[ev(f"u{i % 7}", i) for i in range(20)],
               [ev(f"u{i % 9}", i) for i in range(30)],
               [ev("late", 1), ev("x", 200), ev("u1", 1)],
               [ev("y", 300), ev("u2", 2)]]

    def build(df):
        return df.withWatermark("ts", "60 seconds").dropDuplicates(["user", "ts"])

    root = store["root"]
    harness.checkpoint_root = lambda name: f"{root}/{name}/ck" if name else root
    harness.source_on_checkpoint_store = True
    workdir = scratch_dir("arrowstate-cluster-")
    off = run_query(spark, workdir, schema, batches, build, arrowstate=False)
    on = run_query(spark, workdir, schema, batches, build, arrowstate=True,
                   custom_metrics=["stateCacheHits", "stateCacheMisses"])
    # Speculation: partition 1's first attempt at version 3 waits 20 s (the speculative copy
    # may first wait out locality levels, 3 s each) before writing its
    # delta, long after the second attempt committed the same version, then writes it too.
    spark.conf.set("spark.sql.streaming.checkpointFileManagerClass", INJECTING)
    spark.conf.set("arrowstate.test.attemptLog", attempt_log)
    spark.conf.set("arrowstate.test.slowFirstAttempt", ".*/state/0/1/3\\.arrowstate\\.delta=20000")
    # (Spark's own run writes no arrowstate files: the run above is its oracle too)
    spec_on = run_query(spark, workdir, schema, batches, build, arrowstate=True)
    executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
    # where each executor keeps its local files (Spark's block manager's directories)
    local_dirs = sorted(set(spark.sparkContext.parallelize(range(8), 8).map(
        lambda _: __import__("os").environ.get("SPARK_EXECUTOR_DIRS", "?")).collect()))
    # This app's workers: under its executors (their command names the app), or under its
    # driver JVM (a child of this process), where none may be. Other Spark apps of the
    # machine (the test session's own) are left out.
    app_id = spark.sparkContext.applicationId
    ours = [p for p in state_worker_pids()
            if app_id in parent_command(p) or parent_pid(jvm_pid(p)) == os.getpid()]
    print(json.dumps({
        "same_outputs": _as_text(on.outputs) == _as_text(off.outputs),
        "same_figures": on.figures == off.figures,
        "batches": len(on.outputs),
        "arrow_node_in_plan": all("ArrowStreamingDeduplicate" in p for p in on.plans),
        "executors": executors,
        "cache_hits": sum(c[0]["stateCacheHits"] or 0 for c in on.custom.values()),
        "worker_parents": [parent_command(p) for p in ours],
        "speculation_same_outputs": _as_text(spec_on.outputs) == _as_text(off.outputs),
        "speculation_same_figures": spec_on.figures == off.figures,
        "checkpoints": [off.checkpoint, on.checkpoint, spec_on.checkpoint],
        "executor_local_dirs": local_dirs,
    }))
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
