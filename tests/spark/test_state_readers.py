"""Spark's own state readers on arrowstate checkpoints: `statestore` (latest, every batchId,
the change feed, from a snapshot) and `state-metadata` return for an arrowstate checkpoint
what they return for the native checkpoint of the same query on the same input."""
import datetime as dt
import os
import time

import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout

import fmgws_functions as fns
from harness import run_query

cloudpickle.register_pickle_by_value(fns)

EVENTS = pa.schema([("user", pa.string()), ("ts", pa.timestamp("us", tz="UTC")),
                    ("v", pa.int64())])


def ev(user, second, v=1):
    return {"user": user, "ts": dt.datetime.fromtimestamp(second, dt.timezone.utc), "v": v}


BATCHES = [[ev("a", 1), ev("b", 2), ev("a", 3)], [ev("a", 4), ev("c", 25), ev("b", 5)],
           [ev("d", 40), ev("a", 41)], [ev("e", 70), ev("b", 71), ev(None, 72)]]

CASES = {
    "dedup": (lambda df: df.dropDuplicates(["user"]), "append"),
    "dedup_within_watermark": (lambda df: df.withWatermark("ts", "10 seconds")
                               .dropDuplicatesWithinWatermark(["user"]), "append"),
    "aggregation_update": (lambda df: df.groupBy("user").agg(F.sum("v"), F.max("ts")),
                           "update"),
    "aggregation_complete": (lambda df: df.groupBy("user").count(), "complete"),
    "aggregation_append": (lambda df: df.withWatermark("ts", "10 seconds")
                           .groupBy(F.window("ts", "10 seconds")).count(), "append"),
    "apply_in_pandas_with_state": (
        lambda df: df.withWatermark("ts", "10 seconds").groupBy("user")
        .applyInPandasWithState(fns.event_time_sessions, "user string, what string, value long",
                                "count long, latest long", "Update",
                                GroupStateTimeout.EventTimeTimeout), "update"),
}


def _rows(df):
    return sorted(map(str, df.collect()))


def _both(spark, tmp_path, name, **kwargs):
    build, mode = CASES[name]
    runs = [run_query(spark, str(tmp_path), EVENTS, BATCHES, build, arrowstate=on,
                      output_mode=mode, restart_after=[1], **kwargs) for on in (False, True)]
    return [r.checkpoint for r in runs], max(runs[0].outputs)


@pytest.mark.parametrize("name", list(CASES))
def test_statestore_and_state_metadata_read_arrowstate_as_native(spark, tmp_path, name):
    (native, ours), last = _both(spark, tmp_path, name)
    assert any(p.name.endswith(".arrowstate.delta")
               for p in (tmp_path.glob("run*-on/ck/state/0/*/*")))

    def read(**options):
        reader = spark.read.format("statestore")
        for k, v in options.items():
            reader = reader.option(k, v)
        return [_rows(reader.load(ck)) for ck in (native, ours)]

    latest = read()
    assert latest[0] and latest[1] == latest[0]
    for batch in range(last + 1):
        expected, got = read(batchId=batch)
        assert got == expected, batch
    expected, got = read(readChangeFeed=True, changeStartBatchId=0)
    assert expected and got == expected
    expected, got = read(readChangeFeed=True, changeStartBatchId=1, changeEndBatchId=2)
    assert got == expected
    native_meta, our_meta = (_rows(spark.read.format("state-metadata").load(ck))
                             for ck in (native, ours))
    assert our_meta == native_meta


def test_reading_from_a_snapshot(spark, spark_conf, tmp_path):
    """snapshotStartBatchId/snapshotPartitionId: from a snapshot both engines wrote (Spark
    writes them in its maintenance task, so each batch leaves it time to run)."""
    spark_conf(**{"spark.sql.streaming.stateStore.minDeltasForSnapshot": 1,
                  "spark.sql.streaming.stateStore.maintenanceInterval": "100ms"})
    (native, ours), last = _both(spark, tmp_path, "aggregation_update",
                                 between_batches=lambda i, ck: time.sleep(1))

    def snapshots(ck, partition):
        d = os.path.join(ck, "state", "0", str(partition))
        return {int(n.split(".")[0]) for n in os.listdir(d) if n.endswith("snapshot")}

    def from_snapshot(ck, partition, version):
        return _rows(spark.read.format("statestore").option("snapshotStartBatchId", version - 1)
                     .option("snapshotPartitionId", partition).option("batchId", last).load(ck))

    # the engines snapshot different versions; each engine's read from each of its own
    # snapshots must give the partition's state at the last batch, as native Spark reads it
    for partition in range(3):
        expected = [r for r in _rows(spark.read.format("statestore").option("batchId", last)
                                     .load(native)) if f"partition_id={partition})" in r]
        assert snapshots(native, partition) and snapshots(ours, partition)
        for ck in (native, ours):
            for version in snapshots(ck, partition):
                assert from_snapshot(ck, partition, version) == expected, (ck, version)
    # a version without a snapshot: both refuse it with Spark's error
    for ck in (native, ours):
        missing = min(set(range(1, last + 2)) - snapshots(ck, 0))
        with pytest.raises(Exception, match="CANNOT_READ_MISSING_SNAPSHOT_FILE"):
            from_snapshot(ck, 0, missing)
