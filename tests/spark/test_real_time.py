"""Real-time mode (`trigger(realTime=...)`): Python state functions on arrowstate, which no
engine runs there otherwise. Oracle: the same function in micro-batch mode on Spark, per key
the same outputs and the same final state (only the timing of emission differs)."""
import time

import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F

import procinfo
import real_time as rt
from harness import read_state
from test_workers import seen_by_app

cloudpickle.register_pickle_by_value(rt)

FAMILIES = {
    "applyInPandasWithState": (
        lambda df: df.groupBy("user").applyInPandasWithState(
            rt.running_total, rt.OUTPUT, "n long, total long", "update", "NoTimeout"),
        "ArrowFlatMapGroupsWithState"),
    "transformWithStateInPandas": (
        lambda df: df.groupBy("user").transformWithStateInPandas(
            rt.RunningTotal(), rt.OUTPUT, "Update", "None"), "ArrowTransformWithState"),
    "transformWithState": (
        lambda df: df.groupBy("user").transformWithState(
            rt.RunningTotalRows(), rt.OUTPUT, "Update", "None"), "ArrowTransformWithState"),
}
# what Spark's state reader needs to read each family's state
READ = {"applyInPandasWithState": {}, "transformWithStateInPandas": {"stateVarName": "state"},
        "transformWithState": {"stateVarName": "state"}}

PARTS = [[("a", 1), ("b", 2), ("a", 3)], [("c", 4), ("a", 5)], [("b", 6), ("b", 7), ("d", 8)]]


@pytest.fixture
def real_time_conf(spark_conf):
    # one source partition and one shuffle partition: two task slots, the test session's
    # (and the store real-time mode sets, which the micro-batch oracle's TWS needs)
    spark_conf(**{"spark.sql.shuffle.partitions": 1,
                  "spark.sql.streaming.realTimeMode.minBatchDuration": "500",
                  "spark.sql.streaming.stateStore.providerClass":
                      "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"})


def _wait(predicate, timeout=90, what=""):
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _real_time_run(spark, tmp_path, build, restart=True, fault=None, arrowstate=True,
                   outputs=len):
    """The query in real-time mode over PARTS, stopped (its batch committed) and restarted
    after the first: the sink's rows, the plans, and the checkpoint. `outputs(rows sent)`:
    how many output rows they make (one per row unless told). `fault(i)`, if given,
    runs once part i's output reached the sink, in the middle of a long-running batch; a
    query that fails then is started again from its checkpoint, as an operator would."""
    source = rt.LowLatencySource(spark)
    name = "rt" if arrowstate else "rt-spark"
    sink = rt.RecordingSink(str(tmp_path / f"{name}.jsonl"))
    checkpoint = str(tmp_path / name)
    plans = []

    def start():
        spark.conf.set("spark.arrowstate.enabled", str(arrowstate).lower())
        try:
            return (sink.writer(build(source.df)).outputMode("update")
                    .trigger(realTime="1 second").option("checkpointLocation", checkpoint)
                    .start())
        finally:
            spark.conf.set("spark.arrowstate.enabled", "true")

    query, sent, before = start(), 0, 0   # rows sent; rows committed by earlier runs

    def committed():
        return before + sum(p["numInputRows"] for p in query.recentProgress)

    for i, part in enumerate(PARTS):
        source.add(part)
        sent += len(part)
        out = outputs([row for p in PARTS[:i + 1] for row in p])
        _wait(lambda: len(sink.rows()) >= out or query.exception() is not None,
              what=f"{out} rows at the sink")
        assert query.exception() is None, query.exception()
        if fault is not None and fault(i):
            # the batch fails or its task is retried: either way, what it committed before
            # stays, and the batch's rows are processed again from the checkpoint
            time.sleep(3)
            if query.exception() is not None or not query.isActive:
                before = committed()
                query = start()
            _wait(lambda: committed() >= sent or query.exception() is not None,
                  what="the recovered batch's commit")
        if restart and i == 0:
            # a batch commits at its end: wait for it, then restart from the checkpoint
            _wait(lambda: committed() >= sent, what="the batch's commit")
            plans.append(query._jsq.explainInternal(False))
            query.stop()
            before = sent
            query = start()
    _wait(lambda: committed() >= sent or query.exception() is not None,
          what="the last batch's commit")
    plans.append(query._jsq.explainInternal(False))
    query.stop()
    return sink.rows(), plans, checkpoint


def _micro_batch_run(spark, tmp_path, build):
    """Spark's own run of the same function in micro-batch mode, a batch per part."""
    source = rt.LowLatencySource(spark)
    rows, checkpoint = [], str(tmp_path / "mb")
    spark.conf.set("spark.arrowstate.enabled", "false")
    try:
        query = (build(source.df).writeStream.foreachBatch(lambda df, _: rows.extend(df.collect()))
                 .outputMode("update").option("checkpointLocation", checkpoint).start())
        for part in PARTS:
            source.add(part)
            query.processAllAvailable()
        query.stop()
    finally:
        spark.conf.set("spark.arrowstate.enabled", "true")
    return rows, checkpoint


# spark.arrowstate.realTime.flushMs: 0 (the default) sends the rows queued when the worker
# is free; above 0 a flush waits that long after its first row for more. With flushes of at
# most one row (maxRecordsPerBatch 1) the rows queued meanwhile go one flush each.
@pytest.mark.parametrize("family,flush_ms,flush_rows", [
    *((f, 0, None) for f in sorted(FAMILIES)), ("transformWithState", 20, None),
    ("transformWithStateInPandas", 0, 1)])
def test_python_state_functions_run_in_real_time_mode(spark, spark_conf, real_time_conf,
                                                      tmp_path, family, flush_ms, flush_rows):
    spark_conf(**{"spark.arrowstate.realTime.flushMs": flush_ms})
    if flush_rows:
        spark_conf(**{"spark.sql.execution.arrow.maxRecordsPerBatch": flush_rows})
    build, node = FAMILIES[family]
    expected, native_checkpoint = _micro_batch_run(spark, tmp_path, build)
    rows, plans, checkpoint = _real_time_run(spark, tmp_path, build)
    assert rt.per_key(rows) == rt.per_key(expected)
    assert all(node in p and "real-time" in p for p in plans), plans
    # the final state, as Spark's reader gives it
    assert (read_state(spark, checkpoint, None, READ[family])
            == read_state(spark, native_checkpoint, None, READ[family]))


# a real-time batch far longer than the latency test takes (it stops the query mid-batch):
# output held back to the batch's end would come at least this late
LONG_BATCH_S = 30


def _dedup(df):
    return df.dropDuplicates(["user"])


@pytest.mark.parametrize("family", [*sorted(FAMILIES), "dropDuplicates"])
def test_output_comes_as_rows_arrive_not_at_the_batch_end(spark, real_time_conf, tmp_path,
                                                          family):
    """Each part's first output row reaches the sink well within a real-time batch of
    LONG_BATCH_S: latency = its arrival at the sink - the time its part was added to the
    source. Output held back to the batch's end (or for most of it) would make it nearly
    LONG_BATCH_S: the warm-up row's output would come at the first batch's end, each part
    would then be added in the next batch and wait for its end too."""
    build = _dedup if family == "dropDuplicates" else FAMILIES[family][0]
    source = rt.LowLatencySource(spark)
    sink = rt.RecordingSink(str(tmp_path / "out.jsonl"))
    query = (sink.writer(build(source.df)).outputMode("update")
             .trigger(realTime=f"{LONG_BATCH_S} seconds")
             .option("checkpointLocation", str(tmp_path / "ck")).start())
    latencies = []
    try:
        # warm-up: until its row comes back, the first batch's tasks are starting
        source.add([("warm-up", 0)])
        _wait(lambda: sink.rows() or query.exception() is not None, 120, "the warm-up row")
        for part in PARTS:
            values = {v for _, v in part}
            sent_at = time.time()
            source.add(part)
            _wait(lambda: any(r["v"] in values for r in sink.rows())
                  or query.exception() is not None, 3 * LONG_BATCH_S, "the part's output")
            assert query.exception() is None, query.exception()
            latencies.append(min(r["at"] for r in sink.rows() if r["v"] in values) - sent_at)
        plan = query._jsq.explainInternal(False)
    finally:
        query.stop()
    node = "ArrowStreamingDeduplicate" if family == "dropDuplicates" else FAMILIES[family][1]
    assert node in plan and "real-time" in plan, plan
    # well under the batch's length: a switch between batches, were one to fall here,
    # holds rows back 0.7-2 s (tests/helpers/kafka.py)
    assert max(latencies) < LONG_BATCH_S / 6, (
        f"first output row of each part {[round(x, 2) for x in latencies]} s after the part "
        f"was added, in a real-time batch of {LONG_BATCH_S} s: output waited for the batch")


def test_a_worker_lost_in_a_long_running_batch_loses_nothing(spark, real_time_conf, tmp_path):
    """The state worker is killed while a real-time batch runs, after it emitted some rows:
    the batch's rows are processed again from the last committed state. The sink may see a
    row twice (real-time mode's output is at least once); per key, the rows and the final
    state are those of an uninterrupted run."""
    build, _ = FAMILIES["transformWithStateInPandas"]
    expected, native_checkpoint = _micro_batch_run(spark, tmp_path, build)
    killed = []

    def kill_after_second_part(i):
        if i == 1:
            killed.append(procinfo.kill_own_state_workers())
            return True
        return False

    rows, _, checkpoint = _real_time_run(spark, tmp_path, build, fault=kill_after_second_part)
    assert killed and killed[0] > 0
    assert {k: sorted(set(v)) for k, v in rt.per_key(rows).items()} == rt.per_key(expected)
    assert (read_state(spark, checkpoint, None, READ["transformWithStateInPandas"])
            == read_state(spark, native_checkpoint, None, READ["transformWithStateInPandas"]))


def test_deduplication_runs_in_real_time_mode_as_spark_s_own(spark, real_time_conf, tmp_path):
    """Oracle: Spark's own real-time deduplication on the same input (each row's result
    emitted as it is processed)."""
    def build(df):
        return df.dropDuplicates(["user"])

    def firsts(sent):
        return len({user for user, _ in sent})

    native, _, _ = _real_time_run(spark, tmp_path, build, arrowstate=False, outputs=firsts)
    rows, plans, checkpoint = _real_time_run(spark, tmp_path, build, outputs=firsts)
    assert sorted((r["user"], r["v"]) for r in rows) == sorted(
        (r["user"], r["v"]) for r in native)
    assert all("ArrowStreamingDeduplicate" in p and "real-time" in p for p in plans), plans
    # the state: every key seen (Spark's reader does not read its own real-time checkpoint:
    # it looks for the version's changelog without the commit log's checkpoint id)
    state = spark.read.format("statestore").load(checkpoint).collect()
    assert sorted(r.key.user for r in state) == sorted({u for p in PARTS for u, _ in p})


def test_processing_time_timers_fire_by_the_live_clock(spark, real_time_conf, tmp_path):
    """Timers are checked against the executor's clock after each flush and at the batch's
    end: each timer fires once, no sooner than it is due, while the query runs on (it is not
    restarted), and leaves no state behind."""
    def build(df):
        return df.groupBy("user").transformWithState(
            rt.ExpiresAfter(), "user string, v long, kind string", "Update", "ProcessingTime")

    rows, plans, checkpoint = _real_time_run(
        spark, tmp_path, build, restart=False,
        outputs=lambda sent: len(sent) + len({user for user, _ in sent}))
    assert all("ArrowTransformWithState" in p and "real-time" in p for p in plans), plans
    by_key: dict = {}
    for r in rows:
        by_key.setdefault(r["user"], []).append(r)
    assert sorted(by_key) == sorted({u for p in PARTS for u, _ in p})
    for user, got in by_key.items():
        expired = [r for r in got if r["kind"] == "expired"]
        echoed = sorted(r["v"] for r in got if r["kind"] == "row")
        assert echoed == sorted(v for p in PARTS for u, v in p if u == user)
        # a timer per run of the key's rows (a later row sets a new one once the last fired)
        parts = sum(any(u == user for u, _ in p) for p in PARTS)
        assert 1 <= len(expired) <= parts, got
        assert len({r["v"] for r in expired}) == len(expired), got
        # each fired no sooner than due (by the clock the processor read), after a row
        assert all(r["at"] * 1000 >= r["v"] for r in expired), got
        assert min(r["at"] for r in got if r["kind"] == "row") < expired[0]["at"], got
    assert spark.read.format("statestore").option("stateVarName", "due").load(
        checkpoint).count() == 0


@pytest.mark.slow
def test_without_the_allowlist_real_time_operators_stay_spark_s(test_jar):
    """A driver where adding arrowstate's nodes to Spark's real-time allowlist fails
    (tests/helpers/allowlist_refused_app.py): planning asks Spark's list, so real-time
    deduplication stays Spark's, with the reason in EXPLAIN and Spark's answers, and a Python
    state function fails with Spark's own error, as without arrowstate."""
    seen = seen_by_app("allowlist_refused_app.py", test_jar)
    assert seen["allowlist_holds"] and not any(seen["allowlist_holds"]), seen
    assert seen["dedup_error"] is None and seen["dedup_spark_error"] is None, seen
    assert seen["dedup_rows"] == seen["dedup_spark_rows"] == [["a", 1], ["b", 2], ["c", 4]], seen
    plan, explained = seen["dedup_plan"].split("== Extended Information (arrowstate) ==")
    assert "+- StreamingDeduplicate [user" in plan and "Arrow" not in plan, plan
    assert ("StreamingDeduplicate (operator 0) stays Spark's" in explained and
            "real-time mode (Trigger.RealTime): Spark's real-time allowlist does not hold "
            "ArrowStreamingDeduplicateExec" in explained), explained
    error, spark_error = seen["function_error"], seen["function_spark_error"]
    assert "OPERATOR_OR_SINK_NOT_IN_ALLOWLIST" in (spark_error or ""), spark_error
    assert "FlatMapGroupsInPandasWithStateExec" in (error or "") and "Arrow" not in error, error


def test_a_key_the_worker_cannot_group_leaves_the_function_to_spark(spark, real_time_conf,
                                                                    tmp_path):
    """A real-time transformWithState grouped by a double (which Arrow does not compare as
    Spark does) stays Spark's, its reason in EXPLAIN; Spark then refuses the Python operator
    in real-time mode with its own error, as without arrowstate. (The error names the node's
    class, here the subclass of Spark's node that arrowstate's planning makes for the
    processor's pre-init: TransformWithStateInPySparkPlanned.)"""
    source = rt.LowLatencySource(spark)
    by_double = source.df.withColumn("user", F.col("v").cast("double"))
    sink = rt.RecordingSink(str(tmp_path / "out.jsonl"))
    query = (sink.writer(by_double.groupBy("user").transformWithState(
                 rt.RunningTotalRows(), "user double, v long, n long, total long", "Update",
                 "None"))
             .outputMode("update").trigger(realTime="1 second")
             .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        source.add([("a", 1)])
        _wait(lambda: query.exception() is not None, what="Spark's refusal")
        error = str(query.exception())
        assert "OPERATOR_OR_SINK_NOT_IN_ALLOWLIST" in error, error
        assert "TransformWithStateInPySpark" in error, error
        explained = query._jsq.explainInternal(False)
        assert ("grouping key user of type DOUBLE is not compared alike in Arrow and Spark"
                in explained), explained
    finally:
        query.stop()
