"""transformWithState (Row API) and transformWithStateInPandas with the processor in the
worker that holds its state, against native Spark (which needs the RocksDB state store for
them): the same rows per batch, the same state figures and Spark's metrics of the operator,
across restarts."""
import datetime as dt
import os

import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.errors import StreamingQueryException

import tws_processors as procs
from arrowstate.spark_state import CheckpointError
from harness import (assert_same, assert_state_reads_same, run_query, state_command,
                     ttl_masked)

cloudpickle.register_pickle_by_value(procs)

EVENTS = pa.schema([("user", pa.string()), ("ts", pa.timestamp("us", tz="UTC")),
                    ("v", pa.int64())])
NODE = "ArrowTransformWithState"
VARS = ["numValueStateVars", "numListStateVars", "numMapStateVars", "numDeletedStateVars"]


def ev(user, second, v=1):
    return {"user": user, "ts": dt.datetime.fromtimestamp(second, dt.timezone.utc), "v": v}


BATCHES = [[ev("a", 1, 1), ev("b", 2, 2), ev("a", 3, 1)], [ev("a", 4, 3), ev("c", 5, 1)],
           [], [ev("a", 6, 1), ev("b", 7, 1), ev(None, 8, 2)], [ev("b", 9, 2), ev("c", 10, 2)]]


@pytest.fixture(autouse=True)
def rocksdb(spark_conf):
    # with its changelog, which Spark's change feed of the native state reads
    spark_conf(**{"spark.sql.streaming.stateStore.providerClass":
                  "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
                  "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled":
                  "true"})


# the Row API's twin runs in test_tws_spark_scenarios.py::test_state_variable_tour[rows]
def test_value_list_and_map_state(spark, spark_conf, tmp_path):
    # two rows per Arrow batch: keys' rows span batches, and each key is still one call
    spark_conf(**{"spark.sql.execution.arrow.maxRecordsPerBatch": 2})

    def build(df):
        return df.groupBy("user").transformWithStateInPandas(
            procs.EveryVariable(), procs.EVERY_VARIABLE_OUTPUT, "Append", "None")

    native, ours = assert_same(spark, tmp_path, EVENTS, BATCHES, build, expect_node=NODE,
                               output_mode="append", restart_after=[1, 3],
                               custom_metrics=VARS)
    assert ours.custom == native.custom
    assert any(f[0]["numRowsRemoved"] for f in ours.figures.values())
    assert assert_state_reads_same(spark, native, ours, [1, max(ours.outputs)],
                                   ["count", "items", "seen"], change_feed=True)


@pytest.mark.parametrize("key, budget, worker_sorts", [
    ("user", None, True), ("v", None, True), ("day", None, True), ("half", None, False),
    ("user", "1g", False)])
def test_the_worker_sorts_keys_that_sort_alike_in_arrow(spark, spark_conf, tmp_path, key,
                                                         budget, worker_sorts):
    """Keys that Arrow orders and compares as Spark does (strings, integers, dates) reach the
    worker unsorted and the worker sorts a task's rows; a float key, or a worker memory
    budget, keeps Spark's sort (which spills). Spark's answers either way: null keys, a
    key's rows over several Arrow batches, restarts."""
    from pyspark.sql import functions as F
    spark_conf(**{"spark.sql.execution.arrow.maxRecordsPerBatch": 2})
    if budget:
        spark_conf(**{"spark.arrowstate.worker.memory": budget})
    batches = BATCHES + [[ev(f"u{i % 7}", 20 + i, i % 5) for i in range(40)]]

    def build(df):
        return (df.withColumn("day", F.to_date("ts")).withColumn("half", F.col("v") / 2)
                .groupBy(key).transformWithState(procs.CountPerKey(), "key string, count long",
                                                 "Update", "None"))

    native, ours = assert_same(spark, tmp_path, EVENTS, batches, build, expect_node=NODE,
                               output_mode="update", restart_after=[2])
    plans = [p[p.index("ArrowTransformWithState"):] for p in ours.plans]
    assert all(("Sort [" in p) != worker_sorts for p in plans), plans
    assert ("Sort [" in native.plans[0]), native.plans[0]


# the Row API: test_tws_spark_scenarios_time.py::test_non_contiguous_grouping_with_initial_state
@pytest.mark.parametrize("api", ["pandas"])
def test_an_initial_state_seeds_the_first_batch(spark, tmp_path, api):
    # a key seeded twice, one seeded and never seen, one seeded with no input in batch 0
    initial = spark.createDataFrame([("a", 5), ("a", 1), ("z", 7), ("c", 2)],
                                    "user string, n long").groupBy("user")

    def seeded(df):
        grouped = df.groupBy("user")
        run = (grouped.transformWithStateInPandas if api == "pandas"
               else grouped.transformWithState)
        return run(procs.SeededCount(rows_api=api == "rows"), "user string, count long",
                   "Update", "None", initialState=initial)

    native, ours = assert_same(spark, tmp_path, EVENTS, BATCHES, seeded, expect_node=NODE,
                               output_mode="update", restart_after=[0, 2])
    assert ("a", 8) in native.outputs[0], native.outputs   # 5 + 1 seeded, 2 rows
    assert native.figures[0][0]["numRowsTotal"] == 4        # a, b, and z, c from seeds


TIMERS = ["numRegisteredTimers", "numDeletedTimers", "numExpiredTimers"]
# event times (s): the watermark (2 s delay) passes timers 5 s after a key's latest row;
# the last batch's rows are late (dropped and counted)
TIMED_BATCHES = [[ev("a", 10), ev("b", 12)], [ev("a", 20), ev("c", 30)], [],
                 [ev("b", 40), ev("a", 41)], [ev("a", 5), ev("c", 39)], [ev("d", 60)]]


# the pandas API: test_tws_spark_scenarios_time.py::test_event_time_timers
@pytest.mark.parametrize("processor, api", [(procs.SessionTimeoutRows, "rows")])
def test_event_time_timers(spark, tmp_path, processor, api):
    def build(df):
        grouped = df.withWatermark("ts", "2 seconds").groupBy("user")
        run = (grouped.transformWithStateInPandas if api == "pandas"
               else grouped.transformWithState)
        return run(processor(), procs.SESSION_OUTPUT, "Append", "EventTime")

    native, ours = assert_same(spark, tmp_path, EVENTS, TIMED_BATCHES, build,
                               expect_node=NODE, output_mode="append", restart_after=[1, 3],
                               custom_metrics=TIMERS)
    assert ours.custom == native.custom
    assert assert_state_reads_same(spark, native, ours, [1, max(ours.outputs)], ["count"],
                                   timers=True, change_feed=True)
    fired = [r for rows in ours.outputs.values() for r in rows if "expired" in r[2]]
    assert {r[0] for r in fired} == {"a", "b", "c", "d"}, fired
    assert sum(f[0]["numRowsDroppedByWatermark"] for f in ours.figures.values()) >= 1


def test_processing_time_timers(spark, spark_conf, tmp_path):
    # ProcessingTime queries always run another batch: without no-data batches each input
    # file is one batch, so both runs see the same batches
    spark_conf(**{"spark.sql.streaming.noDataMicroBatches.enabled": "false"})
    native, ours = assert_same(
        spark, tmp_path, EVENTS, BATCHES,
        lambda df: df.groupBy("user").transformWithStateInPandas(
            procs.ProcessingTimeTimers(), procs.SESSION_OUTPUT, "Update", "ProcessingTime"),
        expect_node=NODE, output_mode="update", restart_after=[1], custom_metrics=TIMERS)
    assert ours.custom == native.custom


def test_state_variables_with_ttl(spark, spark_conf, tmp_path):
    spark_conf(**{"spark.sql.streaming.noDataMicroBatches.enabled": "false"})
    ttl = ["numValueStateWithTTLVars", "numListStateWithTTLVars", "numMapStateWithTTLVars",
           "numValuesRemovedDueToTTLExpiry"]
    native, ours = assert_same(
        spark, tmp_path, EVENTS, BATCHES,
        lambda df: df.groupBy("user").transformWithStateInPandas(
            procs.EveryVariableWithTTL(), procs.SESSION_OUTPUT, "Update", "ProcessingTime"),
        expect_node=NODE, output_mode="update", restart_after=[1, 3], custom_metrics=ttl)
    assert ours.custom == native.custom
    assert sum(c[0]["numValuesRemovedDueToTTLExpiry"] for c in ours.custom.values()) > 0
    assert_state_reads_same(spark, native, ours, [1, max(ours.outputs)],
                            ["count", "last", "items", "seen"], masked=ttl_masked,
                            change_feed=True)


@pytest.mark.local_checkpoints
def test_a_state_variable_added_then_removed_between_runs(spark, tmp_path):
    """The second run's processor adds a variable; the third no longer declares it (its
    rows stay, counted); the fourth deletes it with deleteIfExists without declaring it."""
    starts = {"true": 0, "false": 0}   # per engine: assert_same runs Spark's, then ours
    runs = [procs.RunningCount, procs.RunningCountWithHistory, procs.RunningCount,
            procs.RunningCountDroppingHistory]

    def build(df):
        engine = spark.conf.get("spark.arrowstate.enabled")
        starts[engine] += 1
        return df.groupBy("user").transformWithStateInPandas(
            runs[starts[engine] - 1](), "user string, count long", "Update", "None")

    refused = []

    def convert_while_history_is_kept(i, checkpoint):
        """The state tools carry declared variables only: with the history kept undeclared
        (after the third run), they refuse, naming it, and change nothing."""
        if i == 4 and os.path.dirname(checkpoint).endswith("-on"):   # arrowstate's run
            before = sorted(os.walk(checkpoint))
            for command, args in (("export", ()), ("repartition", ("3",))):
                with pytest.raises(CheckpointError, match=r"\['history'\].*deleteIfExists"):
                    state_command(command, checkpoint, *args)
            assert sorted(os.walk(checkpoint)) == before
            refused.append(i)
        return False

    batches = BATCHES + [[ev("a", 11), ev("c", 12)], [ev("b", 13)]]
    native, ours = assert_same(spark, tmp_path, EVENTS, batches, build, expect_node=NODE,
                               output_mode="update", restart_after=[1, 3, 4],
                               custom_metrics=VARS, on_restart=convert_while_history_is_kept)
    assert refused == [4]
    assert ("a", 4001) in native.outputs[3]   # a's count 4, its history begun after batch 1
    # the history went in batch 5's partitions (each had its column family), then no more
    deleted = {b: sum(p["numDeletedStateVars"] for p in c) for b, c in native.custom.items()}
    assert deleted[5] > 0 and deleted[6] == 0, deleted
    assert ours.custom == native.custom


def _inits(directory):
    """(on the driver, process, parent) of each init() NotesWhereInitRuns noted."""
    noted = []
    for name in os.listdir(directory):
        with open(os.path.join(directory, name)) as f:
            driver, process, parent = f.read().split("\n")
        noted.append((driver == "True", process, parent))
    return noted


@pytest.mark.local_checkpoints
def test_init_while_spark_plans_runs_in_a_forked_worker(spark, tmp_path):
    """Spark learns a processor's state variables on the driver, in a query run's first
    batch, by running its init() against a state server there; natively in a new Python
    interpreter (pyspark's driver worker), with arrowstate in a worker forked from the
    daemon of the function's workers, which has imported pandas and pyspark. Spark's
    answers (rows, state figures, schema files) stay the same."""
    notes = {}

    def build_noting(run):
        directory = tmp_path / f"inits-{run}"
        directory.mkdir()
        notes[run] = str(directory)

        def build(df):
            return df.groupBy("user").transformWithStateInPandas(
                procs.NotesWhereInitRuns(str(directory)), "user string, count long",
                "Update", "None")
        return build

    native = run_query(spark, str(tmp_path), EVENTS, BATCHES[:2], build_noting("off"),
                       arrowstate=False, output_mode="update", restart_after=[0])
    ours = run_query(spark, str(tmp_path), EVENTS, BATCHES[:2], build_noting("on"),
                     arrowstate=True, output_mode="update", restart_after=[0])
    assert ours.outputs == native.outputs and ours.figures == native.figures
    assert any(NODE in plan for plan in ours.plans), ours.plans
    for run, where in (("off", "transform_with_state_driver_worker"),
                       ("on", "arrowstate.worker_daemon")):
        planned = [(process, parent) for driver, process, parent in _inits(notes[run])
                   if driver]
        assert len(planned) == 2, planned   # each query run's first batch
        place = [process if run == "off" else parent for process, parent in planned]
        assert all(where in p for p in place), (run, planned)
    schemas = {run: sorted(os.listdir(os.path.join(r.checkpoint, "state", "0", "_stateSchema",
                                                   "default")))
               for run, r in (("off", native), ("on", ours))}
    assert len(schemas["on"]) == len(schemas["off"]) == 2, schemas


def test_an_error_in_init_while_spark_plans_fails_both_runs(spark, tmp_path):
    """init() raising while the driver plans the first batch: both runs fail before any
    batch, in Spark's words for a failed driver worker, with the user's error."""
    build = (lambda df: df.groupBy("user").transformWithStateInPandas(
        procs.NotesWhereInitRuns(str(tmp_path), fail=True), "user string, count long",
        "Update", "None"))
    for arrowstate in (False, True):
        with pytest.raises(StreamingQueryException) as failure:
            run_query(spark, str(tmp_path), EVENTS, BATCHES[:1], build, arrowstate=arrowstate,
                      output_mode="update")
        messages = []
        java = failure.value._origin
        while java is not None:
            messages.append(java.getMessage() or "")
            java = java.getCause()
        assert "TransformWithStateInPySpark driver worker exited unexpectedly" in messages[0]
        assert any("init() refuses to plan this query" in m for m in messages), messages
