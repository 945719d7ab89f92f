"""Checkpoints where users keep them: each family's differential test with its checkpoint on
HDFS (Hadoop's MiniDFSCluster) and on an S3-compatible object store through `s3a://`
(tests/helpers/storage.py), restarted, and its state read by Spark's `statestore` reader.

The whole differential suite runs on either store with ARROWSTATE_TEST_CHECKPOINTS=hdfs or
s3; this file is the subset CI runs every time."""
import datetime as dt

import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F

import tws_processors as procs
from harness import assert_same, assert_state_reads_same, read_state

cloudpickle.register_pickle_by_value(procs)

pytestmark = pytest.mark.slow

EVENTS = pa.schema([("user", pa.string()), ("ts", pa.timestamp("us", tz="UTC")),
                    ("v", pa.int64())])


def ev(user, second, v=0):
    return {"user": user, "ts": dt.datetime.fromtimestamp(second, dt.timezone.utc), "v": v}


BATCHES = [
    [ev("a", 10, 1), ev("b", 11, 2), ev("a", 12, 3)],
    [ev("a", 20, 4), ev("c", 40, 5), ev("d", 12, 6)],
    [],
    [ev("e", 5, 7), ev("f", 95, 8), ev("c", 41, 9)],
    [ev("g", 100, 10), ev("b", 101, 11)],
]


def _on(store, run) -> None:
    assert run.checkpoint.startswith(store.uri("")), run.checkpoint


def _same_state(spark, native, ours, batch: int) -> None:
    got = [read_state(spark, run.checkpoint, batch, {}) for run in (native, ours)]
    assert got[0] == got[1] and got[1], f"state at batch {batch} differs from Spark's"


def test_deduplication(spark, tmp_path, remote_checkpoints):
    native, ours = assert_same(
        spark, tmp_path, EVENTS, BATCHES,
        lambda df: df.withWatermark("ts", "10 seconds").dropDuplicates(["user", "ts"]),
        expect_node="ArrowStreamingDeduplicate", restart_after=[1, 3])
    _on(remote_checkpoints, ours)
    _same_state(spark, native, ours, 2)


def test_windowed_aggregation_under_a_memory_budget(spark, spark_conf, tmp_path,
                                                    remote_checkpoints):
    """The tier: all state on local disk between batches, rebuilt from the remote
    checkpoint after the restart."""
    spark_conf(**{"spark.arrowstate.worker.memory": "8g",
                  "spark.arrowstate.worker.stateMemoryPercent": "0",
                  "spark.arrowstate.worker.localDir": str(tmp_path / "local")})
    batches = [[ev(f"u{(i * 7 + b) % 40}", b * 15 + i % 15, i) for i in range(120)]
               for b in range(5)] + [[]]
    native, ours = assert_same(
        spark, tmp_path, EVENTS, batches,
        lambda df: df.withWatermark("ts", "10 seconds")
                     .groupBy(F.window("ts", "20 seconds"), "user")
                     .agg(F.count("*").alias("n"), F.sum("v").alias("s")),
        expect_node="ArrowStateStoreSave", output_mode="update", restart_after=[2],
        custom_metrics=["stateDiskBytes"])
    _on(remote_checkpoints, ours)
    assert any(sum(op["stateDiskBytes"] for op in ops) for ops in ours.custom.values())
    _same_state(spark, native, ours, 3)


def test_transform_with_state_timers_and_change_feed(spark, spark_conf, tmp_path,
                                                     remote_checkpoints):
    """transformWithState (the Row API) with event-time timers (Spark's run on RocksDB with its
    changelog, as Spark's change feed needs), restarted; the state, the timers and the
    change feed read by Spark's reader from both checkpoints."""
    spark_conf(**{"spark.sql.streaming.stateStore.providerClass":
                  "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
                  "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled":
                  "true"})
    batches = [[ev("a", 10), ev("b", 12)], [ev("a", 20), ev("c", 30)], [],
               [ev("b", 40), ev("a", 41)], [ev("a", 5), ev("c", 39)], [ev("d", 60)]]
    native, ours = assert_same(
        spark, tmp_path, EVENTS, batches,
        lambda df: df.withWatermark("ts", "2 seconds").groupBy("user")
                     .transformWithState(procs.SessionTimeoutRows(),
                                                 procs.SESSION_OUTPUT, "Append", "EventTime"),
        expect_node="ArrowTransformWithState", output_mode="append", restart_after=[1, 3])
    _on(remote_checkpoints, ours)
    assert_state_reads_same(spark, native, ours, [1, max(ours.outputs)], ["count"],
                            timers=True, change_feed=True)

