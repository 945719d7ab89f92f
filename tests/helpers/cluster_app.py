"""Runs the differential deduplication case on a standalone cluster (one master, two
workers on loopback), so arrowstate's operator and Python workers run inside executor JVMs
that are not the driver's. arrowstate's run is made with its input and checkpoints at each
of `places` (JSON: a list of {"name", "root": a store's URI, or null for the local disk,
"settings": the Spark settings that reach it, "jars": its connector's jars, shipped to the
executors with spark.jars, "speculation": whether to run once more with a task attempt
speculated}), against one run of Spark's own on the local disk (its answers do not depend on
where its checkpoint is). Started by test_cluster.py in its own process, since a process
holds one SparkContext. Prints one JSON line with what it saw.

The local disk stands for a disk every host mounts (the hosts here are one machine); the
stores for a cluster whose hosts share no disk."""
import datetime as dt
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import pyarrow as pa  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

import arrowstate  # noqa: E402
from procinfo import jvm_pid, parent_command, parent_pid, state_worker_pids  # noqa: E402
import harness  # noqa: E402
from harness import _as_text, checkpoint_files, run_query, scratch_dir  # noqa: E402


ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
INJECTING = "org.apache.spark.sql.arrowstate.testing.FailureInjectionFileManager"


def main(master: str, test_jar: str, attempt_logs: str, places: str) -> None:
    places = json.loads(places)
    jars = sorted({j for place in places for j in place["jars"]})
    settings = {k: v for place in places for k, v in place["settings"].items()}
    spark = arrowstate.configure(
        SparkSession.builder.master(master).appName("arrowstate-cluster-test")
        # to the executors through the driver (no shared path); the driver's own class path
        # has them too, as Hadoop loads a filesystem's class from there
        .config("spark.jars", ",".join([test_jar, *jars]))
        .config("spark.driver.extraClassPath", os.pathsep.join(jars))
        .config(map=settings)
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

    workdir = scratch_dir("arrowstate-cluster-")
    off = run_query(spark, workdir, schema, batches, build, arrowstate=False)
    seen = {"places": {place["name"]: _at_place(spark, workdir, schema, batches, build, off,
                                                place, attempt_logs)
                       for place in places}}
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
        **seen,
        "executors": executors,
        "worker_parents": [parent_command(p) for p in ours],
        "oracle_checkpoint": off.checkpoint,
        "executor_local_dirs": local_dirs,
    }))
    spark.stop()


def _at_place(spark, workdir, schema, batches, build, off, place, attempt_logs) -> dict:
    """arrowstate's run with its input and checkpoint at `place`, against Spark's `off`."""
    root = place["root"]
    harness.checkpoint_root = None if root is None else (
        lambda name: f"{root}/{name}/ck" if name else root)
    harness.source_on_checkpoint_store = root is not None
    on = run_query(spark, workdir, schema, batches, build, arrowstate=True,
                   custom_metrics=["stateCacheHits", "stateCacheMisses"])
    seen = {
        "same_outputs": _as_text(on.outputs) == _as_text(off.outputs),
        "same_figures": on.figures == off.figures,
        "batches": len(on.outputs),
        "arrow_node_in_plan": all("ArrowStreamingDeduplicate" in p for p in on.plans),
        "cache_hits": sum(c[0]["stateCacheHits"] or 0 for c in on.custom.values()),
        "checkpoints": [on.checkpoint],
    }
    if place["speculation"]:
        # Speculation: partition 1's first attempt at version 3 waits 20 s (the speculative
        # copy may first wait out locality levels, 3 s each) before writing its delta, long
        # after the second attempt committed the same version, then writes it too: a state
        # task run twice in one batch. Under checkpoint format v2 the commit log keeps the
        # id of the attempt that finished first, and the late one's delta lies beside it.
        spark.conf.set("spark.sql.streaming.checkpointFileManagerClass", INJECTING)
        spark.conf.set("arrowstate.test.attemptLog",
                       os.path.join(attempt_logs, f"{place['name']}.log"))
        spark.conf.set("arrowstate.test.slowFirstAttempt",
                       ".*/state/0/1/3(_[0-9a-f-]+)?\\.arrowstate\\.delta=20000")
        spark.conf.set("spark.sql.streaming.stateStore.checkpointFormatVersion", "2")
        spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
        try:
            spec_on = run_query(spark, workdir, schema, batches, build, arrowstate=True)
        finally:
            for key in ("spark.sql.streaming.checkpointFileManagerClass",
                        "arrowstate.test.attemptLog", "arrowstate.test.slowFirstAttempt",
                        "spark.sql.streaming.stateStore.checkpointFormatVersion",
                        "spark.sql.streaming.stateStore.providerClass"):
                spark.conf.unset(key)
        # both attempts' deltas of version 3, once the late one has written its own
        deltas, until = [], time.monotonic() + 40
        while len(deltas) < 2 and time.monotonic() < until:
            time.sleep(1)
            deltas = checkpoint_files(
                spark, f"{spec_on.checkpoint}/state/0/1/3_*.arrowstate.delta")
        seen["speculation_deltas"] = deltas
        seen.update(speculation_same_outputs=_as_text(spec_on.outputs) == _as_text(off.outputs),
                    speculation_same_figures=spec_on.figures == off.figures)
        seen["checkpoints"].append(spec_on.checkpoint)
    return seen


if __name__ == "__main__":
    main(*sys.argv[1:5])
