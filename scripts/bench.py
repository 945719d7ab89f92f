"""Benchmarks: the same streaming work with arrowstate off (Spark's operators) and on, in one
process. Prints one JSON line per case: rows/s of each (median of --runs), their ratio, the
CPU seconds a run costs the JVM and its Python workers (median) and their ratio, and memory
(JVM heap used after GC, RSS of the arrowstate Python workers).

    python scripts/bench.py [--rows 1000000] [--batches 5] [--keys 50000] [--runs 3]
                            [--cases dedup,agg_update,...]
    python scripts/bench.py --release [--release-keys 2000000] [--batch-rows 2000000]
                            [--conf spark.sql.streaming.stateStore.maintenanceInterval=10s]
    python scripts/bench.py --shapes [--shape-rows-per-key 1,4,100]
                            [--shape-keys 10000,100000,1000000] [--cases ...]
    python scripts/bench.py --scaling [--state-keys 1000000,20000000] [--batch-rows 2000000]
                            [--pyspark-memory 1g] [--batches 3] [--shuffle-partitions 4]
                            [--scaling-case agg|agg_string_keys|tws_pandas_value_count]
    python scripts/bench.py --small-batches [--small-batch-rows 1000] [--small-batch-count 20]
                            [--small-batch-partitions 200] [--cases agg_update,dedup,...]
    python scripts/bench.py --exchange [--cases agg_append,session_window_append,...]
    python scripts/bench.py --economy --checkpoint s3 [--economy-rows 3000]
                            [--economy-batches 6] [--shuffle-partitions 2] [--cases ...]
    python scripts/bench.py --state-load [--state-rows 1000000] [--runs 3]
    python scripts/bench.py --state-ops [--runs 3]
    python scripts/bench.py --tier-ops [--state-keys 5000000] [--batch-rows 500000] [--batches 3]
    python scripts/bench.py --real-time [--rates 1000,10000] [--rt-keys 50000] [--rt-seconds 60]
                            [--rt-partitions 5] [--shuffle-partitions 4] [--cases ...]

The user-function cases (FLOORS) print their floor beside arrowstate and native: the same
function in plain Python with its state in dicts (bench_lib/floor.py), and --shapes runs them
against it over shapes of input (bench_lib/shapes.py).

The SQL cases (deduplication, aggregation, session windows) print beside them the same work
with no state (each micro-batch alone) and each engine's state cost per input row against it;
--small-batches runs many small micro-batches at 200 shuffle partitions (bench_lib/sql.py);
--exchange splits their state cost into the exchange with the worker and Python's state
work, beside Spark's own trip to Python (bench_lib/exchange.py).

--scaling measures state beyond memory: per state size N, a count and sum per key (update
mode; --scaling-case: per string key, or a transformWithStateInPandas count per key in a
ValueState) over batches of --batch-rows new keys each until N keys exist, run by arrowstate
under a memory budget (spark.executor.pyspark.memory, 1g unless --pyspark-memory says
otherwise; a state worker that passes it fails the query) and by Spark on its RocksDB store
with changelog checkpointing, in one process, the engines alternating over --runs runs after
--warmup rounds on a small state, the checkpoints where --checkpoint puts them. It prints
each batch's time, the median over runs of the median of the last --batches, the peak
resident memory of the state workers and of the JVM (sampled every 0.2 s), the files and
bytes each batch wrote under the checkpoint's state/, the object store's requests a batch
(--checkpoint s3), the time to restart at the last version, and whether every batch's
output was the same (a row count and a sum of row hashes per batch); its code is in
scripts/bench_lib/scaling.py.

--real-time measures end-to-end latency per record, Kafka to Kafka, of Python
transformWithState in real-time mode on arrowstate against Spark's JVM transformWithState in
real-time mode and Python's in micro-batch mode (bench_lib/real_time.py).

--tier-ops drives the aggregate family inside one worker without Spark, batches of
--batch-rows new keys until the first --state-keys size, with the state in memory and in the
tier: the tier's cost against the in-memory store on the same path.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench_lib import functions
from bench_lib.cases import CASES, FLOORS, ROCKSDB, SCALING_CASES, TWS
from bench_lib.checkpoints import Checkpoints, per_batch
from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(functions)   # Spark's workers need not import it


def write_batches(directory: str, rows: int, batches: int, keys: int, seed: int = 7,
                  rows_per_key: int | None = None) -> None:
    """`batches` parquet files of `rows` rows in all, of random keys below `keys`; with
    `rows_per_key`, every key `rows_per_key` times in each batch, in random order."""
    rng = np.random.default_rng(seed)
    per_batch = rows // batches if rows_per_key is None else keys * rows_per_key
    start = 1_700_000_000_000_000
    for b in range(batches):
        key = (rng.integers(0, keys, per_batch) if rows_per_key is None
               else rng.permutation(np.repeat(np.arange(keys), rows_per_key)))
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


CHECKPOINTS = Checkpoints("local")   # where run_once's checkpoints go (--checkpoint)


def run_once(spark, source: str, case, arrowstate: bool):
    """Runs the query over every file of `source`; returns seconds and the progress list."""
    build, mode, node = case
    spark.conf.set("spark.arrowstate.enabled", str(arrowstate).lower())
    if node is None:
        spark.conf.unset("spark.sql.streaming.stateStore.providerClass")
    elif node == TWS:
        spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    else:
        spark.conf.unset("spark.sql.streaming.stateStore.providerClass")
    checkpoint = CHECKPOINTS.new()
    try:
        stream = (spark.readStream.schema("key long, user string, ts timestamp, value double")
                  .option("maxFilesPerTrigger", 1).parquet(source))
        t0 = time.perf_counter()
        q = (build(stream).writeStream.format("noop").outputMode(mode)
             .trigger(availableNow=True).option("checkpointLocation", checkpoint).start())
        q.awaitTermination()
        elapsed = time.perf_counter() - t0
        plan = q._jsq.explainInternal(False)
        assert node is None or (node in plan) == arrowstate, plan
        return elapsed, q.recentProgress
    finally:
        unload_state_stores(spark)
        CHECKPOINTS.remove(checkpoint)


def unload_state_stores(spark) -> None:
    """Unloads Spark's state store providers once a run's query ended. Spark's maintenance
    thread (every spark.sql.streaming.stateStore.maintenanceInterval, 60 s) still snapshots
    and cleans a stopped query's stores before it unloads them, in whatever run comes next:
    on HDFS a native run's 200 partitions put 16 files and 34 listings a batch into the
    arrowstate run after it. arrowstate's workers drop a stopped query's state at once."""
    spark._jvm.org.apache.spark.sql.execution.streaming.state.StateStore.stop()


def jit_seconds(spark) -> float:
    """Seconds the driver's JVM (local mode: the executor's too) has spent compiling, over
    all its compiler threads."""
    bean = spark._jvm.java.lang.management.ManagementFactory.getCompilationMXBean()
    return bean.getTotalCompilationTime() / 1000


def batch_times(progress: dict) -> dict:
    """Each engine's first batch of a run apart from its steady batches (the later ones
    with input rows): medians over the runs, ms."""
    figures = {}
    for on, runs in progress.items():
        name = "arrowstate" if on else "native"
        firsts, steady = [], []
        for batches in runs:
            ms = [p["durationMs"]["triggerExecution"] for p in batches]
            firsts.append(ms[0])
            steady.extend(m for m, p in zip(ms[1:], batches[1:]) if p["numInputRows"])
        figures[f"{name}_first_batch_ms"] = round(statistics.median(firsts))
        figures[f"{name}_steady_batch_ms"] = round(statistics.median(steady)) if steady else None
    return figures


def floor_figures(spark, source: str, name: str, args) -> dict:
    """The case's floor (see bench_lib/floor.py): Spark's read and shuffle of the same stream
    into a no-op sink, plus the plain-Python time of the user function; medians of
    --runs."""
    from bench_lib.floor import floor_python_seconds
    kind, function, event_time = FLOORS[name]
    def pipeline_figures(build):
        query = (lambda df: build(df.repartition(args.shuffle_partitions, "key")), "append",
                 None)
        for _ in range(args.warmup):
            run_once(spark, source, query, False)
        runs = [run_once(spark, source, query, False) for _ in range(args.runs)]
        return (statistics.median(seconds for seconds, _ in runs),
                statistics.median(p["durationMs"]["triggerExecution"] for _, batches in runs
                                  for p in batches[1:]))

    pipeline, steady = pipeline_figures(lambda df: df)
    # beside it: the same with Spark's own trip of the rows to a Python worker and back
    # (mapInArrow of the batches as they are), which any engine of Python functions in
    # Spark pays and the floor does not
    trip, trip_steady = pipeline_figures(
        lambda df: df.mapInArrow(functions.as_they_are, df.schema))
    zone = spark.conf.get("spark.sql.session.timeZone")
    floors = [floor_python_seconds(source, kind, function, args.shuffle_partitions,
                                   event_time, zone) for _ in range(args.runs)]
    python = statistics.median(f["python_s"] for f in floors)
    per_batch = statistics.median(f["steady_batch_s"] for f in floors)
    return {"floor_s": round(pipeline + python, 3), "floor_pipeline_s": round(pipeline, 3),
            "floor_python_s": round(python, 3),
            "floor_steady_batch_ms": round(steady + per_batch * 1000),
            "floor_with_python_trip_s": round(trip + python, 3),
            "floor_with_python_trip_steady_batch_ms": round(trip_steady + per_batch * 1000)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=6,
                        help="rounds of unmeasured runs first (each engine in turn; the "
                             "no-state and floor runs as many): the JVM compiles Spark's "
                             "code over a dozen runs, and a run measured before that "
                             "settles carries whichever compiling falls in it")
    parser.add_argument("--checkpoint", choices=("local", "hdfs", "s3"), default="local",
                        help="where the queries' checkpoints are: the local disk, or HDFS or "
                             "an S3-compatible store started here on loopback (the tests' "
                             "own: tests/helpers/storage.py)")
    parser.add_argument("--arrowstate-only", action="store_true",
                        help="leave out Spark's own runs (for long runs of the cases Spark "
                             "runs slowly: transformWithState natively takes 10-20x longer)")
    parser.add_argument("--cases", default=None,
                        help="default: every case (--shapes: every user-function case)")
    parser.add_argument("--scaling", action="store_true")
    parser.add_argument("--release", action="store_true",
                        help="worker memory at start, peak, at a query's stop and one "
                             "maintenance interval later (see bench_lib/release.py)")
    parser.add_argument("--release-keys", type=int, default=2_000_000)
    parser.add_argument("--shapes", action="store_true",
                        help="the user-function cases against their floor over shapes of "
                             "input (see bench_lib/shapes.py)")
    parser.add_argument("--shape-rows-per-key", default="1,4,100")
    parser.add_argument("--shape-keys", default="10000,100000,1000000")
    parser.add_argument("--shape-max-batch-rows", type=int, default=1_000_000)
    parser.add_argument("--small-batches", action="store_true",
                        help="per-trigger time of small micro-batches at many shuffle "
                             "partitions (see bench_lib/sql.py)")
    parser.add_argument("--small-batch-rows", type=int, default=1000)
    parser.add_argument("--small-batch-count", type=int, default=20)
    parser.add_argument("--small-batch-partitions", type=int, default=200)
    parser.add_argument("--economy", action="store_true",
                        help="what a micro-batch costs on the object store, per engine "
                             "(with --checkpoint s3)")
    parser.add_argument("--economy-rows", type=int, default=3000,
                        help="--economy: rows per micro-batch")
    parser.add_argument("--economy-batches", type=int, default=6)
    parser.add_argument("--exchange", action="store_true",
                        help="Spark's SQL operators: arrowstate beside itself with its "
                             "workers doing no state work, no state, and Spark's trip to "
                             "Python (see bench_lib/exchange.py)")
    parser.add_argument("--state-load", action="store_true",
                        help="time state loads and the part spent verifying files (no Spark)")
    parser.add_argument("--tier-ops", action="store_true",
                        help="the aggregate family's cost per batch in one worker, state in "
                             "memory against the tier (no Spark)")
    parser.add_argument("--state-ops", action="store_true",
                        help="time transformWithState state operations in the worker (no "
                             "Spark)")
    parser.add_argument("--store-ops", action="store_true",
                        help="the dict and the hash-table stores of aggregation and "
                             "deduplication: memory and microseconds per key (no Spark)")
    parser.add_argument("--state-rows", type=int, default=1_000_000)
    parser.add_argument("--state-keys", default="1000000,20000000")
    parser.add_argument("--batch-rows", type=int, default=2_000_000,
                        help="--scaling: new keys per batch")
    parser.add_argument("--pyspark-memory", default=None,
                        help="spark.executor.pyspark.memory (--scaling: 1g unless given): "
                             "each state worker's memory budget")
    parser.add_argument("--shuffle-partitions", type=int, default=4)
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the session (repeatable)")
    from bench_lib import real_time
    real_time.add_arguments(parser)
    parser.add_argument("--scaling-case", default="agg", choices=sorted(SCALING_CASES),
                        help="--scaling: the query (default: a count and sum per long key)")
    args = parser.parse_args()
    from bench_lib.economy import ECONOMY_CASES
    from bench_lib.sql import SMALL_BATCH_CASES, is_sql_case, no_state_figures, small_batches
    if not args.real_time:   # (its own cases: bench_lib/real_time.py CASES)
        args.cases = args.cases or ",".join(
            FLOORS if args.shapes else SMALL_BATCH_CASES if args.small_batches
            else ECONOMY_CASES if args.economy else CASES)
    if args.state_load:
        from bench_lib.state_load import state_load
        state_load(args)
        return
    if args.state_ops:
        from bench_lib.state_ops import state_ops
        state_ops(args)
        return
    if args.store_ops:
        from bench_lib.store import store_ops
        store_ops(args)
        return
    if args.tier_ops:
        from bench_lib.scaling import tier_ops
        tier_ops(args)
        return
    if args.real_time:
        real_time.real_time(args)
        return

    from pyspark.sql import SparkSession

    import arrowstate

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "helpers"))
    from bench_lib.scaling import scaling
    from procinfo import descendants_cpu_seconds, rss_bytes, state_worker_pids

    global CHECKPOINTS
    CHECKPOINTS = Checkpoints(args.checkpoint)
    budget = args.pyspark_memory or ("1g" if args.scaling else None)
    exchange_settings = {}
    from bench_lib.worker import (PROFILE_DIR, RECORD_DIR, TASK_CPU_DIR, WIRE_DIR,
                                  session_settings)
    wrapped = (PROFILE_DIR, RECORD_DIR, WIRE_DIR, TASK_CPU_DIR)
    if args.exchange or any(map(os.environ.get, wrapped)):   # before Spark starts:
        exchange_settings = session_settings(skip=args.exchange)   # the workers' python
    spark = arrowstate.configure(
        SparkSession.builder.master("local[2]").appName("arrowstate-bench")
        .config("spark.sql.shuffle.partitions", str(args.shuffle_partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "8g")
        .config(map={"spark.executor.pyspark.memory": budget} if budget else {})
        .config(map=CHECKPOINTS.spark_settings())
        .config(map=dict(c.split("=", 1) for c in args.conf))
    ).config(map=exchange_settings).getOrCreate()   # after configure's own interpreter
    spark.sparkContext.setLogLevel("ERROR")

    def memory() -> dict:
        return {"jvm_heap_used_mb": round(jvm_heap_used(spark) / 2**20),
                "python_workers_rss_mb":
                    round(sum(map(rss_bytes, state_worker_pids())) / 2**20)}

    if (args.scaling or args.shapes or args.release or args.small_batches or args.exchange
            or args.economy):
        try:
            if args.economy:
                from bench_lib.economy import economy
                economy(spark, args, CASES, CHECKPOINTS, write_batches)
            elif args.exchange:
                from bench_lib.exchange import exchange
                exchange(spark, args, CASES, run_once, write_batches)
            elif args.small_batches:
                small_batches(spark, args, CASES, run_once, write_batches,
                              CHECKPOINTS.requests)
            elif args.scaling:
                scaling(spark, args, SCALING_CASES[args.scaling_case], CHECKPOINTS)
            elif args.release:
                from bench_lib.release import release
                from bench_lib.scaling import write_scaling_batches
                release(spark, args, SCALING_CASES["tws_pandas_value_count"],
                        write_scaling_batches)
            else:
                from bench_lib.shapes import shapes
                shapes(spark, args, CASES, run_once, write_batches, floor_figures)
        finally:
            spark.stop()
            CHECKPOINTS.stop()
        return
    source = tempfile.mkdtemp(prefix="bench-in-")
    write_batches(source, args.rows, args.batches, args.keys)
    try:
        for name in args.cases.split(","):
            case = CASES[name]
            engines = (True,) if args.arrowstate_only else (True, False)
            for i in range(args.warmup):   # worker start, and the JIT settling (--warmup)
                for on in (engines if i % 2 == 0 else engines[::-1]):
                    run_once(spark, source, case, on)
            times = {on: [] for on in engines}
            progress = {on: [] for on in engines}
            cpu = {on: [] for on in engines}   # CPU seconds of the JVM and its Python workers
            jit = {on: [] for on in engines}   # of it, the JVM's compiling
            requests = {on: [] for on in engines}   # the object store's, per batch and run
            for i in range(args.runs):
                for on in (engines[::-1] if i % 2 == 0 else engines):
                    before, compiled = descendants_cpu_seconds(), jit_seconds(spark)
                    asked = CHECKPOINTS.requests()
                    seconds, batches = run_once(spark, source, case, on)
                    requests[on].append(per_batch(asked, CHECKPOINTS.requests(), len(batches)))
                    cpu[on].append(descendants_cpu_seconds() - before)
                    jit[on].append(jit_seconds(spark) - compiled)
                    times[on].append(seconds)
                    progress[on].append(batches)
            median = {on: statistics.median(times[on]) for on in engines}
            median_cpu = {on: statistics.median(cpu[on]) for on in engines}
            ours = args.rows / median[True]
            floor = (floor_figures(spark, source, name, args) if name in FLOORS else {})
            no_state = (no_state_figures(spark, source, case, args.rows, args.runs, args.warmup,
                                         median.get(False), median[True])
                        if is_sql_case(case) else {})
            batches = batch_times(progress)
            native = {} if args.arrowstate_only else {
                "native_rows_per_s": round(args.rows / median[False]),
                "ratio": round(median[False] / median[True], 3),
                "native_s": [round(t, 2) for t in times[False]],
                "native_cpu_s": round(median_cpu[False], 2),
                # beside wall time, less moved by what else the machine runs
                "cpu_ratio": round(median_cpu[False] / max(median_cpu[True], 1e-9), 3),
                "native_jit_s": round(statistics.median(jit[False]), 2),
                **({"native_requests_per_batch": requests[False][-1]}
                   if args.checkpoint == "s3" else {})}
            print(json.dumps({
                "case": name, "checkpoint": args.checkpoint, "rows": args.rows,
                "batches": args.batches, "keys": args.keys,
                "runs": args.runs, "arrowstate_rows_per_s": round(ours), **native,
                **({"floor_rows_per_s": round(args.rows / floor["floor_s"]),
                    "arrowstate_vs_floor": round(ours * floor["floor_s"] / args.rows, 3),
                    "arrowstate_vs_floor_steady": round(
                        floor["floor_steady_batch_ms"] / batches["arrowstate_steady_batch_ms"],
                        3),
                    "arrowstate_vs_floor_with_python_trip": round(
                        ours * floor["floor_with_python_trip_s"] / args.rows, 3)}
                   if floor else {}),
                "arrowstate_s": [round(t, 2) for t in times[True]],
                "arrowstate_cpu_s": round(median_cpu[True], 2),
                "arrowstate_jit_s": round(statistics.median(jit[True]), 2),
                **({"arrowstate_requests_per_batch": requests[True][-1]}
                   if args.checkpoint == "s3" else {}),
                **floor, **no_state, **batches,
                **memory()}), flush=True)
    finally:
        shutil.rmtree(source, ignore_errors=True)
        spark.stop()
        CHECKPOINTS.stop()


if __name__ == "__main__":
    main()
