"""Worker lifecycle in a process of its own (it stops and starts SparkContexts, and runs
local[2] without task retries, so a dead worker handed out would fail the query). Started
by tests/spark/test_workers.py; prints one JSON line with what it saw."""
import datetime as dt
import json
import os
import shutil
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

import arrowstate  # noqa: E402
from harness import TEST_JAR_ENV, _as_text, quick_local, run_query, scratch_dir  # noqa: E402
from procinfo import (kill_own_state_workers, own_state_worker_pids, parent_pid,  # noqa: E402
                      rss_bytes)

SCHEMA = pa.schema([("user", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))])


def ev(u, s):
    return {"user": u, "ts": dt.datetime.fromtimestamp(s, dt.timezone.utc)}


def session(jvm_temp: str):
    spark = arrowstate.configure(
        # the JVM's temporary files (Spark's block manager, the workers' fault logs) in the
        # app's scratch directory: the JVM is killed at the end, before it can remove them
        quick_local(SparkSession.builder, os.environ[TEST_JAR_ENV],
                    java_options=f"-Djava.io.tmpdir={jvm_temp}")
        .master("local[2]").appName("arrowstate-worker-test")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        # maintenance every second; workers idle 2 s with no state stop
        .config("spark.sql.streaming.stateStore.maintenanceInterval", "1s")
        # functions' workers get an address-space limit, as Spark's own do
        .config("spark.executor.pyspark.memory", "6g")
        .config("spark.arrowstate.worker.idleTimeoutSeconds", "2")).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def dedup(df):
    return df.dropDuplicates(["user"])


def memory_limit(key, pdfs, state):
    """Reports the address-space limit of the process running the function."""
    import resource

    import pandas as pd

    sum(len(pdf) for pdf in pdfs)   # read the input, as a real function does
    state.update((1,))
    yield pd.DataFrame({"user": [key[0]],
                        "limit": [resource.getrlimit(resource.RLIMIT_AS)[0]]})


def limits(spark, workdir, on):
    from pyspark.sql.streaming.state import GroupStateTimeout

    run = run_query(spark, workdir, SCHEMA, [[ev("a", 1), ev("b", 2)]],
                    lambda df: df.groupBy("user").applyInPandasWithState(
                        memory_limit, "user string, limit long", "n long", "Update",
                        GroupStateTimeout.NoTimeout),
                    arrowstate=on, output_mode="update")
    return sorted({r[1] for rows in run.outputs.values() for r in rows})


def main() -> None:
    seen = {}
    workdir = scratch_dir("arrowstate-workers-")
    jvm_temp = os.path.join(workdir, "jvm-tmp")
    os.makedirs(jvm_temp)
    batches = [[ev(f"u{i % 5}", i) for i in range(10)], [ev("a", 1), ev("u1", 2)],
               [ev("b", 3), ev("a", 4)], [ev("c", 5)]]

    # 1. Workers killed while idle are not handed out: with no task retries, the query
    #    would die on a dead one.
    spark = session(jvm_temp)

    def kill_idle_workers(i, _checkpoint):
        if i == 2:
            kill_own_state_workers()
            time.sleep(0.5)
            seen["killed"] = True

    off = run_query(spark, workdir, SCHEMA, batches, dedup, arrowstate=False)
    on = run_query(spark, workdir, SCHEMA, batches, dedup, arrowstate=True,
                   between_batches=kill_idle_workers, custom_metrics=["stateCacheMisses"])
    seen["dead_worker_same_outputs"] = _as_text(on.outputs) == _as_text(off.outputs)
    seen["reloaded_after_kill"] = sum(c[0]["stateCacheMisses"] for b, c in on.custom.items()
                                      if b >= 2)

    seen["memory_limits_native"] = limits(spark, workdir, False)
    seen["memory_limits_arrowstate"] = limits(spark, workdir, True)

    # 2. No worker outlives its SparkContext; a new one in the same process gets a fresh pool.
    #    (A spare worker still starting when the env stops ends once it has started.)
    spark.stop()
    deadline = time.time() + 15
    while own_state_worker_pids() and time.time() < deadline:
        time.sleep(0.2)
    seen["workers_after_spark_stop"] = len(own_state_worker_pids())
    spark = session(jvm_temp)
    again = run_query(spark, workdir, SCHEMA, batches, dedup, arrowstate=True)
    seen["new_session_same_outputs"] = _as_text(again.outputs) == _as_text(off.outputs)

    # 3. Memory follows the work: 400K keys, the query stops, the state is dropped within the
    #    maintenance interval and the idle, empty workers stop.
    fresh = max(map(rss_bytes, own_state_worker_pids()), default=0)
    big = [[{"user": f"user-{i}", "ts": dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)}
            for i in range(k * 200_000, (k + 1) * 200_000)] for k in range(2)]
    run_query(spark, workdir, SCHEMA, big, dedup, arrowstate=True)
    # run_query stopped the query; measure at once, then after the maintenance interval
    held = own_state_worker_pids()
    seen["rss_after_stop_mb"] = round(sum(map(rss_bytes, held)) / 2**20)
    # what the workers hold beyond a fresh worker's size each
    seen["held_after_stop_mb"] = round((sum(map(rss_bytes, held)) - len(held) * fresh) / 2**20)
    deadline = time.time() + 30
    while time.time() < deadline and own_state_worker_pids():
        time.sleep(0.5)
    seen["rss_later_mb"] = round(sum(map(rss_bytes, own_state_worker_pids())) / 2**20)
    seen["workers_left"] = len(own_state_worker_pids())

    # 4. No worker outlives its executor: the JVM is killed while one worker holds idle state
    #    and another is inside a user's function.
    run_query(spark, workdir, SCHEMA, batches, dedup, arrowstate=True)
    source = scratch_dir("arrowstate-kill-source-")
    marker = os.path.join(workdir, "function-started")
    pq.write_table(pa.Table.from_pylist(batches[0], schema=SCHEMA),
                   os.path.join(source, "0.parquet"))
    from pyspark.sql.streaming.state import GroupStateTimeout
    spark.readStream.schema(spark.read.parquet(source).schema).parquet(source) \
        .groupBy("user").applyInPandasWithState(
            lambda key, pdfs, state: sleeps(marker, key, pdfs, state), "user string",
            "n long", "Update", GroupStateTimeout.NoTimeout) \
        .writeStream.format("noop").outputMode("update") \
        .option("checkpointLocation", os.path.join(workdir, "kill-ck")).start()
    deadline = time.time() + 60
    while time.time() < deadline and not os.path.exists(marker):
        time.sleep(0.2)
    workers = own_state_worker_pids()
    seen["workers_at_kill"] = len(workers)
    seen["function_running_at_kill"] = os.path.exists(marker)
    jvms = {parent_pid(w) for w in workers}
    for jvm in jvms:
        os.kill(jvm, signal.SIGKILL)
    deadline = time.time() + 15
    while time.time() < deadline and any(os.path.exists(f"/proc/{w}") for w in workers):
        time.sleep(0.2)
    seen["workers_alive_after_kill"] = [w for w in workers if os.path.exists(f"/proc/{w}")]
    print(json.dumps(seen))
    sys.stdout.flush()
    for directory in (workdir, source):   # os._exit skips scratch_dir's cleanup
        shutil.rmtree(directory, ignore_errors=True)
    os._exit(0)   # the JVM is gone: no orderly py4j shutdown to wait for


def sleeps(marker, key, pdfs, state):
    """Signals that it runs, then stays inside the function for a long time."""
    sum(len(pdf) for pdf in pdfs)
    open(marker, "w").close()
    time.sleep(300)
    yield from ()


if __name__ == "__main__":
    main()
