"""--real-time: end-to-end latency per record, Kafka to Kafka, of the SPARK-58884 workload (a
ValueState read and updated per record, one output record per input record, over --rt-keys
keys), at each of --rates records/s, for each engine and trigger mode (CASES):

- arrowstate's Python transformWithState (Row and pandas APIs) in real-time mode;
- Spark's JVM transformWithState in real-time mode (a Scala processor from the test sources,
  tests/jvm/RealTimeLatencyQuery.scala): the baseline;
- Spark's own real-time aggregation (a count per key: the streamline operator) on the same
  input;
- the Python transformWithState (Row API) in micro-batch mode, on Spark and on arrowstate.

A one-node KRaft broker on loopback (tests/helpers/kafka.py: test-time downloads with mvn)
holds the input topic (--rt-partitions partitions) and each case's output topic. Per case: the
query starts; records go in at the rate until one comes back and for --rt-warmup seconds more
(not measured: the first batch's start, the JIT); then the records due within the next
--rt-seconds are measured, each from the time the producer's schedule gave it to its first
output's arrival in Python (both time.time_ns on this machine: tests/helpers/latency.py), so
that a producer falling behind does not hide the wait, and those that never come back (within
60 s of the window's end) are counted. The executed plan is checked to run the case's engine
(an arrowstate node for arrowstate's cases, none for Spark's): a case that ran on the other
fails the bench. A real-time batch lasts --rt-batch (longer than a case: no batch ends within
the measured window, whose switch would pause the source). One JSON line per case: `case`,
`engine`, `mode`, `records_per_s`, `p50_ms`, `p95_ms`, `p99_ms`, `max_ms` (of the records
received), `due` (the records due in the window), `received`, `never_received`, `unsent`
(of those never received, the ones the producer had not sent when the case stopped),
`producer_max_lag_ms` (the most a record was sent after its due time), the median
latency over each tenth of the window (does it grow?), and for arrowstate's real-time cases
the flushes in the window and the p50 and p99 of their round trip to the worker
(`flush_round_trip_*_ms`: from a flush posted to its answer read, in the executor:
exec/FlushRoundTrips.scala). Each case's checkpoint goes where --checkpoint says (local disk,
HDFS or S3: bench_lib/checkpoints.py), named on its line.

The cases run in turn, in --rt-warmup-rounds rounds (lines marked `"warmup": true`) and then
--rt-rounds measured ones (each line with its `round`), then one `summary` line per case:
the median of each figure over the measured rounds, and, beside Spark's JVM
transformWithState (the reference), each round's p50 and p99 over the reference's in that
round and their medians (`p50_vs_reference`): the machine's speed drifts between rounds,
at times both engines' latencies climbing together (`steal_pct` on each line: the CPU the
hypervisor gave elsewhere). One JVM runs every case, and the first case in it carries a minute or more
of the JIT compiling the path all cases share (its median latency fell from 62 to 35 ms
over a 30-second window, and its JVM CPU a record was twice the next case's), so a figure
from a single pass favours the cases that run later.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from pyspark.sql import functions as F

from arrowstate import contract
from bench_lib import functions

ROOT = Path(__file__).resolve().parents[2]
# each output record carries its input record's sequence number (PacedProducer's `seq`)
OUTPUT = "key string, seq long, count long"


def _events(spark, bootstrap: str, topic: str):
    return (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic).option("startingOffsets", "latest").load()
            .select(F.col("key").cast("string").alias("key"),
                    F.get_json_object(F.col("value").cast("string"), "$.seq")
                    .cast("long").alias("seq")))


def _python_tws(pandas_api: bool):
    def build(events):
        grouped = events.groupBy("key")
        if pandas_api:
            counted = grouped.transformWithStateInPandas(
                functions.PandasLatencyCount(), OUTPUT, "Update", "None")
        else:
            counted = grouped.transformWithState(
                functions.RowLatencyCount(), OUTPUT, "Update", "None")
        return counted.select("key", F.to_json(F.struct("key", "seq", "count"))
                              .alias("value"))
    return build


def _streamline_count(events):
    # an update of a key's count carries the newest seq it counted: it stands for each of the
    # key's records up to that one (latency.first_arrivals)
    counted = events.groupBy("key").agg(F.count("*").alias("count"),
                                        F.max("seq").alias("seq"))
    return counted.select("key", F.to_json(F.struct("key", "seq", "count")).alias("value"))


# case -> (engine, mode, the query's DataFrame from the events, or None: the JVM query,
# whether an output stands for one input record or for its key's records so far)
CASES = {
    "tws_rows_real_time": ("arrowstate", "real-time", _python_tws(False), "record"),
    "tws_pandas_real_time": ("arrowstate", "real-time", _python_tws(True), "record"),
    "tws_jvm_real_time": ("spark", "real-time", None, "record"),
    "count_real_time": ("spark", "real-time", _streamline_count, "key"),
    "tws_rows_micro_batch_spark": ("spark", "micro-batch", _python_tws(False), "record"),
    "tws_rows_micro_batch": ("arrowstate", "micro-batch", _python_tws(False), "record"),
}
# the nodes an arrowstate plan has (one per family: contract.json)
ARROWSTATE_NODES = sorted({f["node"] for f in contract.FAMILIES.values()})


def add_arguments(parser) -> None:
    """bench.py's options of --real-time."""
    parser.add_argument("--real-time", action="store_true",
                        help="end-to-end latency per record, Kafka to Kafka, in real-time and "
                             "micro-batch modes (bench_lib/real_time.py)")
    parser.add_argument("--rates", default="1000,10000", help="--real-time: records/s")
    parser.add_argument("--rt-keys", type=int, default=50_000)
    parser.add_argument("--rt-partitions", type=int, default=5,
                        help="--real-time: the input topic's partitions")
    parser.add_argument("--rt-seconds", type=float, default=60,
                        help="--real-time: the measured window of each case")
    parser.add_argument("--rt-warmup", type=float, default=15)
    parser.add_argument("--rt-rounds", type=int, default=3,
                        help="--real-time: measured rounds of every case, in turn")
    parser.add_argument("--rt-warmup-rounds", type=int, default=1,
                        help="--real-time: rounds of every case before them, printed as "
                             "warm-up: the JIT compiles the shared path (Kafka, the shuffle) "
                             "in the first case for a minute or more")
    parser.add_argument("--rt-batch", default="10 minutes",
                        help="--real-time: a real-time batch's length (longer than a case)")


def _bench_jar(workdir: str) -> str:
    """The JVM processor's query, compiled against Spark and the shim."""
    from arrowstate.shim import compile_scala, jar_path, write_jar
    out = Path(workdir) / "classes"
    out.mkdir()
    compile_scala([ROOT / "tests" / "jvm" / "RealTimeLatencyQuery.scala"], out, [jar_path()])
    return str(write_jar(out, Path(workdir) / "arrowstate-bench.jar"))


def real_time(args) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "helpers"))
    from kafka import KafkaBroker, connector_jars
    from pyspark import cloudpickle
    from pyspark.sql import SparkSession

    import arrowstate
    from bench_lib.checkpoints import Checkpoints

    cloudpickle.register_pickle_by_value(functions)
    workdir = tempfile.mkdtemp(prefix="bench-rt-")
    checkpoints = Checkpoints(args.checkpoint)   # where each case's checkpoint goes
    cases = args.cases.split(",") if args.cases else list(CASES)
    rates = [int(r) for r in args.rates.split(",")]
    keys = args.rt_keys
    try:
        jars = connector_jars() + [_bench_jar(workdir)]
        with KafkaBroker(partitions=args.rt_partitions) as broker:
            # a real-time stage group holds a slot per partition of each stage at once
            slots = args.rt_partitions + args.shuffle_partitions
            spark = arrowstate.configure(
                SparkSession.builder.master(f"local[{slots}]").appName("arrowstate-bench-rt")
                .config("spark.jars", ",".join(jars))
                .config("spark.sql.shuffle.partitions", str(args.shuffle_partitions))
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .config("spark.driver.memory", "4g")
                # what real-time mode sets, for the micro-batch cases too (Spark's Python
                # transformWithState needs RocksDB)
                .config("spark.sql.streaming.stateStore.providerClass",
                        "org.apache.spark.sql.execution.streaming.state."
                        "RocksDBStateStoreProvider")
                .config(map=checkpoints.spark_settings())
                .config(map=dict(c.split("=", 1) for c in args.conf))
            ).getOrCreate()
            spark.sparkContext.setLogLevel("OFF")
            try:
                measured: dict[tuple, list[dict]] = {}
                for round_ in range(args.rt_warmup_rounds + args.rt_rounds):
                    warmup = round_ < args.rt_warmup_rounds
                    for rate in rates:
                        for name in cases:
                            line = _run_case(spark, broker, name, rate, keys, args,
                                             checkpoints.new(), round_)
                            line.update(round=round_, warmup=warmup)
                            print(json.dumps(line), flush=True)
                            if not warmup:
                                measured.setdefault((name, rate), []).append(line)
                for (name, rate), lines in measured.items():
                    reference = measured.get((REFERENCE, rate)) if name != REFERENCE else None
                    print(json.dumps(summary(lines, reference)), flush=True)
            finally:
                spark.stop()
    finally:
        checkpoints.stop()
        shutil.rmtree(workdir, ignore_errors=True)


# a case's figures its summary line gives the median of, over the measured rounds
SUMMED_UP = ("p50_ms", "p95_ms", "p99_ms", "max_ms", "machine_busy_pct", "steal_pct",
             "jvm_cpu_ms_per_record", "worker_cpu_ms_per_record", "flushes",
             "flush_round_trip_p50_ms", "flush_round_trip_p99_ms")


# the case the others are measured against, round by round
REFERENCE = "tws_jvm_real_time"


def summary(lines: list[dict], reference: list[dict] | None = None) -> dict:
    """One case's measured rounds summed up: the median of each figure (`SUMMED_UP`), each
    round's p50 and p99 beside it, and the records never received over all rounds. Given the
    reference case's lines of the same rounds: each round's p50 and p99 over the reference's
    in that round, and their medians; the machine's speed drifts between rounds (at times
    both engines' latencies climb together), so a ratio within a round is the fair one."""
    import statistics
    first = lines[0]
    ratios = {}
    by_round = {line["round"]: line for line in reference or []}
    for figure in ("p50_ms", "p99_ms"):
        paired = [line[figure] / by_round[line["round"]][figure] for line in lines
                  if by_round.get(line["round"], {}).get(figure) and line.get(figure)]
        if paired:
            name = figure.replace("_ms", "_vs_reference")
            ratios[name] = round(statistics.median(paired), 2)
            ratios[f"{name}_by_round"] = [round(r, 2) for r in paired]
    return {"case": first["case"], "engine": first["engine"], "mode": first["mode"],
            "checkpoint": first["checkpoint"], "records_per_s": first["records_per_s"],
            "summary": f"median of {len(lines)} rounds",
            **{k: round(statistics.median(line[k] for line in lines), 3)
               for k in SUMMED_UP if all(line.get(k) is not None for line in lines)},
            "p50_ms_by_round": [line.get("p50_ms") for line in lines],
            "p99_ms_by_round": [line.get("p99_ms") for line in lines],
            "never_received": sum(line["never_received"] for line in lines),
            **({"reference": REFERENCE, **ratios} if ratios else {})}


def _run_case(spark, broker, name: str, rate: int, keys: int, args, checkpoint: str,
              round_: int = 0) -> dict:
    from bench import unload_state_stores
    from kafka import PacedProducer, TopicRecorder   # (tests/helpers, on the path here)
    from latency import percentile, schedule_latencies

    engine, mode, build, stands_for = CASES[name]
    tag = f"{name}-{rate}-{round_}"
    topic_in, topic_out = f"in-{tag}", f"out-{tag}"
    broker.create_topic(topic_in, args.rt_partitions)
    broker.create_topic(topic_out, args.rt_partitions)
    real_time = args.rt_batch if mode == "real-time" else ""
    spark.conf.set("spark.arrowstate.enabled", str(engine == "arrowstate").lower())
    if build is None:
        query = spark._jvm.org.apache.spark.sql.arrowstate.bench.RealTimeLatencyQuery.start(
            spark._jsparkSession, broker.bootstrap, topic_in, topic_out, checkpoint, real_time)
        def failed():   # a JVM query's failure
            e = query.exception()
            return RuntimeError(e.get().toString()) if e.isDefined() else None
        stop, explain = query.stop, query.explainInternal
    else:
        writer = (build(_events(spark, broker.bootstrap, topic_in)).writeStream
                  .format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
                  .option("topic", topic_out).option("checkpointLocation", checkpoint)
                  .outputMode("update"))
        query = (writer.trigger(realTime=real_time) if real_time else writer).start()
        failed, stop, explain = query.exception, query.stop, query._jsq.explainInternal
    recorder = TopicRecorder(broker.bootstrap, topic_out).start()
    # each flush's post-to-answer time in the executor (arrowstate's real-time cases)
    trips = spark._jvm.org.apache.spark.sql.arrowstate.exec.FlushRoundTrips

    def key_of(seq: int) -> str:   # keys in a stride over all of them, each as often
        return f"k{(seq * 7919) % keys}"
    producer = PacedProducer(broker.bootstrap, topic_in, rate, make_key=key_of)
    try:
        producer.start()
        # until a record comes back (the first batch's start), then --rt-warmup seconds more
        recorder.wait_for(1, timeout=180, failed=failed)
        _check_engine(name, engine, explain(False))
        time.sleep(args.rt_warmup)
        trips.drain()
        cpu_before = _cpu(spark)
        start = time.time_ns()
        time.sleep(args.rt_seconds)
        due = producer.schedule.due_within(start, time.time_ns())
        cpu = [after - before for after, before in zip(_cpu(spark), cpu_before)]
        round_trips = sorted(n / 1e6 for n in trips.drain())

        def measured():
            outputs = [(a.arrived_ns, a.value["key"], a.value["seq"])
                       for a in recorder.arrivals() if isinstance(a.value, dict)]
            return schedule_latencies(producer.schedule, due, outputs,
                                      key_of if stands_for == "key" else None)
        # the window's last records, on their way (seconds in micro-batch mode)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and failed() is None and measured()[1]:
            time.sleep(1)   # (arrival times are taken as records come: not by this loop)
    finally:
        producer.stop()
        recorder.stop()
        stop()
        unload_state_stores(spark)   # Spark's RocksDB stores of the stopped query, if any
    latencies, never = measured()
    in_order = [latencies[s] for s in sorted(latencies)]
    ordered = sorted(in_order)
    tenths = [sorted(in_order[i * len(in_order) // 10:(i + 1) * len(in_order) // 10])
              for i in range(10)] if len(in_order) >= 10 else []
    return {"case": name, "engine": engine, "mode": mode, "checkpoint": args.checkpoint,
            "records_per_s": rate,
            "keys": keys, "partitions": args.rt_partitions,
            "shuffle_partitions": args.shuffle_partitions,
            "due": len(due), "received": len(latencies), "never_received": len(never),
            "unsent": sum(1 for s in never if s >= producer.sent),
            "producer_max_lag_ms": round(producer.max_lag_ms, 1),
            **({"p50_ms": round(percentile(ordered, 50), 1),
                "p95_ms": round(percentile(ordered, 95), 1),
                "p99_ms": round(percentile(ordered, 99), 1),
                "max_ms": round(ordered[-1], 1),
                "p50_ms_by_tenth": [round(percentile(t, 50), 1) for t in tenths if t]}
               if ordered else {}),
            # where the window's CPU went: the machine's two cores, Spark's JVM, the state
            # workers (what bounds latency once the cores are full)
            "machine_busy_pct": round(100 * cpu[0] / cpu[1], 1) if cpu[1] else None,
            # the share the hypervisor gave other machines: a slower machine, not our work
            "steal_pct": round(100 * cpu[2] / cpu[1], 1) if cpu[1] else None,
            "jvm_cpu_ms_per_record": round(1000 * cpu[3] / max(len(due), 1), 3),
            "worker_cpu_ms_per_record": round(1000 * cpu[4] / max(len(due), 1), 3),
            **({"flushes": len(round_trips),
                "flush_round_trip_p50_ms": round(percentile(round_trips, 50), 2),
                "flush_round_trip_p99_ms": round(percentile(round_trips, 99), 2)}
               if round_trips else {})}


def _cpu(spark) -> tuple[float, float, float, float, float]:
    """The machine's busy, total and stolen CPU time (/proc/stat, all cores; busy counts the
    stolen), then the CPU seconds of
    Spark's JVM (the gateway's process: driver and executor in local mode) and of its state
    workers, so far."""
    from procinfo import own_cpu_seconds, own_state_worker_pids   # (tests/helpers)
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    idle = ticks[3] + ticks[4]   # idle, iowait
    hz = os.sysconf("SC_CLK_TCK")
    return ((sum(ticks) - idle) / hz, sum(ticks) / hz, ticks[7] / hz,
            own_cpu_seconds(spark.sparkContext._gateway.proc.pid),
            sum(map(own_cpu_seconds, own_state_worker_pids())))


def _check_engine(name: str, engine: str, plan: str) -> None:
    """Fails the bench when the executed plan does not run the case's engine: an arrowstate
    node for arrowstate's cases, none for Spark's."""
    found = [node for node in ARROWSTATE_NODES if node in plan]
    if (engine == "arrowstate") != bool(found):
        raise RuntimeError(
            f"case {name} is to run on {engine}, but its executed plan has "
            + (f"arrowstate's {', '.join(found)}" if found else
               f"no arrowstate node (none of {', '.join(ARROWSTATE_NODES)})") + f":\n{plan}")
