"""Checkpoints where users keep them: every family's differential test with its checkpoint on
HDFS (Hadoop's MiniDFSCluster) and on an S3-compatible object store through `s3a://`
(tests/helpers/storage.py), each restarted mid-stream from its checkpoint, its state read by
Spark's `statestore` reader (and its change feed) from Spark's checkpoint and arrowstate's,
several under a memory budget (the disk tier).

Families chain where Spark lets them (several stateful operators in one append-mode query)
and micro-batches are few and small: on each store every query costs a few seconds.

The whole differential suite runs on either store with ARROWSTATE_TEST_CHECKPOINTS=hdfs or
s3; this file is the subset CI runs every time."""
import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout

import fmgws_functions as fns
import harness
import tws_processors as procs
from harness import EVENTS, assert_same, assert_state_reads_same, ev, read_state, ttl_masked

cloudpickle.register_pickle_by_value(procs)
cloudpickle.register_pickle_by_value(fns)

pytestmark = pytest.mark.slow

# repeats within a batch and across batches (same user, time and value), a late row, and
# the watermark (10 s behind) moving past windows, sessions and timeouts after the second
# and third (Spark runs a batch without data for them); the queries restart after the
# second
BATCHES = [
    [ev("a", 10, 1), ev("b", 11, 2), ev("a", 10, 1), ev("a", 12, 3)],
    [ev("a", 14, 4), ev("c", 40, 5), ev("d", 12, 6), ev("b", 11, 2)],
    [ev("e", 5, 7), ev("f", 95, 8), ev("c", 43, 9), ev("g", 130, 10), ev("b", 101, 11)],
]
DEDUP, SAVE, SESSION = ("ArrowStreamingDeduplicate", "ArrowStateStoreSave",
                        "ArrowSessionWindowStateStoreSave")


@pytest.fixture(scope="session", autouse=True)
def _stores_starting(remote_stores):
    """Both stores start while the session does (this module's first test waits for it)."""
    remote_stores.start(*remote_stores.KINDS)


@pytest.fixture(autouse=True)
def _oracle_on_local_disk():
    """Spark's runs (the oracle) with their checkpoints on the local disk, one for both
    stores: Spark's answers do not depend on where its checkpoint is (the whole suite
    under ARROWSTATE_TEST_CHECKPOINTS runs both on the store)."""
    harness.oracle_on_local_disk = True
    yield
    harness.oracle_on_local_disk = False


def _on(store, ours) -> None:
    assert ours.checkpoint.startswith(store.uri("")), ours.checkpoint


def _states_same(spark, native, ours, operators: int = 1) -> None:
    """Each operator's state after the last batch and its change feed over every batch, as
    Spark's reader gives them from both checkpoints."""
    last = max(ours.outputs)
    for op in range(operators):
        feed = {"readChangeFeed": "true", "changeStartBatchId": 0, "changeEndBatchId": last}
        for batch, options in ((last, {}), (None, feed)):
            options = {**options, "operatorId": op}
            got = [read_state(spark, run.checkpoint, batch, options) for run in (native, ours)]
            assert got[1] == got[0] and got[0], (options, got)


def _in_plans(run, *nodes) -> None:
    assert all(node in plan for plan in run.plans for node in nodes), run.plans


@pytest.fixture
def tiered(spark_conf, tmp_path):
    """The tier as test_state_tier.py sets it: a budget far over what the query needs, with
    no state kept in memory between batches (all of it on local disk, rebuilt from the
    remote checkpoint after the restart)."""
    spark_conf(**{"spark.arrowstate.worker.memory": "8g",
                  "spark.arrowstate.worker.stateMemoryPercent": "0",
                  "spark.arrowstate.worker.localDir": str(tmp_path / "local")})


def _on_disk(run) -> list[int]:
    """Per operator, whether any batch left state on the local disk."""
    return [any(ops[i]["stateDiskBytes"] for ops in run.custom.values())
            for i in range(len(next(iter(run.custom.values()))))]


def test_deduplication_and_windowed_aggregation_in_append_mode_under_a_budget(
        spark, tmp_path, remote_checkpoints, tiered):
    """dropDuplicates with a watermark, then a windowed aggregation in append mode: two
    stateful operators, both in the tier."""
    native, ours = assert_same(
        spark, tmp_path, EVENTS, BATCHES,
        lambda df: df.withWatermark("ts", "10 seconds").dropDuplicates(["user", "ts"])
                     .groupBy(F.window("ts", "20 seconds"), "user")
                     .agg(F.count("*").alias("n"), F.sum("v").alias("s")),
        expect_node=DEDUP, output_mode="append", restart_after=[1],
        custom_metrics=["stateDiskBytes"])
    _in_plans(ours, SAVE)
    _on(remote_checkpoints, ours)
    assert _on_disk(ours) == [True, True]
    assert any(op["numRowsDroppedByWatermark"] for ops in ours.figures.values() for op in ops)
    _states_same(spark, native, ours, operators=2)


def test_deduplication_within_watermark_and_session_windows(spark, tmp_path,
                                                            remote_checkpoints):
    """dropDuplicatesWithinWatermark, then session windows in append mode."""
    native, ours = assert_same(
        spark, tmp_path, EVENTS, BATCHES,
        lambda df: df.withWatermark("ts", "10 seconds")
                     .dropDuplicatesWithinWatermark(["user", "v"])
                     .groupBy(F.session_window("ts", "5 seconds"), "user")
                     .agg(F.count("*").alias("n"), F.max("v").alias("top")),
        expect_node=DEDUP, output_mode="append", restart_after=[1])
    _in_plans(ours, SESSION)
    _on(remote_checkpoints, ours)
    _states_same(spark, native, ours, operators=2)


@pytest.mark.parametrize("mode", ["update", "complete"])
def test_aggregation(spark, tmp_path, remote_checkpoints, mode):
    """Aggregation in update mode (windows evicted as the watermark passes them) and in
    complete mode (every group, every batch)."""
    def build(df):
        if mode == "update":
            df = df.withWatermark("ts", "10 seconds").groupBy(F.window("ts", "20 seconds"),
                                                              "user")
        else:
            df = df.groupBy("user")
        return df.agg(F.count("*").alias("n"), F.sum("v").alias("s"))

    native, ours = assert_same(spark, tmp_path, EVENTS, BATCHES, build, expect_node=SAVE,
                               output_mode=mode, restart_after=[1])
    _on(remote_checkpoints, ours)
    _states_same(spark, native, ours)


def test_apply_in_pandas_with_state_under_a_budget(spark, tmp_path, remote_checkpoints,
                                                   tiered):
    """applyInPandasWithState with an event-time timeout (sessions closed as the watermark
    passes them), in the tier."""
    native, ours = assert_same(
        spark, tmp_path, EVENTS, BATCHES,
        lambda df: df.withWatermark("ts", "10 seconds").groupBy("user")
                     .applyInPandasWithState(fns.event_time_sessions,
                                             "user string, what string, value long",
                                             "count long, latest long", "Update",
                                             GroupStateTimeout.EventTimeTimeout),
        expect_node="ArrowFlatMapGroupsWithState", output_mode="update", restart_after=[1],
        custom_metrics=["stateDiskBytes"])
    _on(remote_checkpoints, ours)
    assert _on_disk(ours) == [True]
    assert any(r[1] == "closed" for rows in ours.outputs.values() for r in rows)
    _states_same(spark, native, ours)


@pytest.fixture
def rocksdb(spark_conf):
    """Spark's transformWithState needs RocksDB; with its changelog, as the change feed of
    Spark's state needs."""
    spark_conf(**{"spark.sql.streaming.stateStore.providerClass":
                  "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
                  "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled":
                  "true"})


def test_transform_with_state_rows_with_event_time_timers(spark, tmp_path, remote_checkpoints,
                                                          rocksdb):
    """transformWithState (the Row API) with event-time timers; the state, the timers and
    the change feed read from both checkpoints."""
    # the third batch's first row is late (the watermark 2 s behind)
    batches = [[ev("a", 10), ev("b", 12)], [ev("a", 20), ev("c", 30)],
               [ev("a", 5), ev("b", 40), ev("a", 41), ev("d", 60)]]
    native, ours = assert_same(
        spark, tmp_path, EVENTS, batches,
        lambda df: df.withWatermark("ts", "2 seconds").groupBy("user")
                     .transformWithState(procs.SessionTimeoutRows(), procs.SESSION_OUTPUT,
                                         "Append", "EventTime"),
        expect_node="ArrowTransformWithState", output_mode="append", restart_after=[1])
    _on(remote_checkpoints, ours)
    assert any("expired" in r[2] for rows in ours.outputs.values() for r in rows)
    assert_state_reads_same(spark, native, ours, [max(ours.outputs)], ["count"],
                            timers=True, change_feed=True)


def test_transform_with_state_in_pandas_with_ttl_and_processing_time_timers(
        spark, spark_conf, tmp_path, remote_checkpoints, rocksdb):
    """transformWithStateInPandas with state kept by TTL (an hour, and 1 ms: expired by the
    key's next batch) and processing-time timers (one due at once, one in the next batch);
    the state, the timers and the change feed read from both checkpoints, the clock's
    times hidden."""
    # processing-time queries would run no-data batches on the clock: one batch a file
    spark_conf(**{"spark.sql.streaming.noDataMicroBatches.enabled": "false"})
    ttl = ["numValuesRemovedDueToTTLExpiry", "numRegisteredTimers"]
    native, ours = assert_same(
        spark, tmp_path, EVENTS, BATCHES,
        lambda df: df.groupBy("user").transformWithStateInPandas(
            procs.EveryVariableWithTTLAndTimers(), procs.SESSION_OUTPUT, "Update",
            "ProcessingTime"),
        expect_node="ArrowTransformWithState", output_mode="update", restart_after=[1],
        custom_metrics=ttl)
    assert ours.custom == native.custom
    _on(remote_checkpoints, ours)
    assert all(sum(c[0][k] for c in ours.custom.values()) for k in ttl), ours.custom
    assert any("timer fired" in r[2] for rows in ours.outputs.values() for r in rows)
    assert_state_reads_same(spark, native, ours, [max(ours.outputs)], ["items"],
                            timers=True, change_feed=True, masked=ttl_masked)


@pytest.mark.parametrize("name,snapshots", [("dedup", "manifests"),
                                            ("transformWithStateInPandas", "snapshots")])
def test_a_late_attempts_files_under_checkpoint_format_v2(spark, spark_conf, tmp_path,
                                                          remote_checkpoints, name, snapshots):
    """Another attempt's deltas, snapshots and run files land after our commit, on the
    store: no load reads them, Spark's answers (test_checkpoint_ids.py has every family on
    the local disk)."""
    from test_checkpoint_ids import assert_late_attempt_passed_over
    assert_late_attempt_passed_over(spark, spark_conf, tmp_path, name, snapshots)
