"""Spark's own state readers on arrowstate checkpoints: `statestore` (latest, every batchId,
the change feed, from a snapshot) and `state-metadata` return for an arrowstate checkpoint
what they return for the native checkpoint of the same query on the same input."""
import datetime as dt
import glob
import json
import os
import subprocess
import sys
import time

import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout

import fmgws_functions as fns
from arrowstate.spark_state import describe
from harness import checkpoint_files, native_run, run_query, state_command, store_options

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
    "session_window_append": (lambda df: df.withWatermark("ts", "10 seconds")
                              .groupBy(F.session_window("ts", "5 seconds"), "user")
                              .agg(F.count("*"), F.max("v")), "append"),
    "session_window_complete": (lambda df: df.groupBy("user", F.session_window("ts", "5 seconds"))
                                .count(), "complete"),
    "apply_in_pandas_with_state": (
        lambda df: df.withWatermark("ts", "10 seconds").groupBy("user")
        .applyInPandasWithState(fns.event_time_sessions, "user string, what string, value long",
                                "count long, latest long", "Update",
                                GroupStateTimeout.EventTimeTimeout), "update"),
}


def _rows(df):
    return sorted(map(str, df.collect()))


def _read_both(spark, checkpoints, **options):
    """Each checkpoint's rows as Spark's `statestore` reader gives them, with `options`."""
    reader = spark.read.format("statestore")
    for k, v in options.items():
        reader = reader.option(k, v)
    return [_rows(reader.load(ck)) for ck in checkpoints]


def _both(spark, tmp_path, name, **kwargs):
    build, mode = CASES[name]
    runs = [native_run(spark, tmp_path, EVENTS, BATCHES, build, output_mode=mode,
                       restart_after=[1], **kwargs),
            run_query(spark, str(tmp_path), EVENTS, BATCHES, build, arrowstate=True,
                      output_mode=mode, restart_after=[1], **kwargs)]
    return [r.checkpoint for r in runs], max(runs[0].outputs)


def _provider(spark_conf, provider):
    """The state store provider the query records: set only when not Spark's default, so
    that the native run of a case is shared with the tests that keep the default."""
    if provider != HDFS:
        spark_conf(**{"spark.sql.streaming.stateStore.providerClass":
                      f"org.apache.spark.sql.execution.streaming.state.{provider}"})


@pytest.mark.parametrize("name", list(CASES))
def test_statestore_and_state_metadata_read_arrowstate_as_native(spark, tmp_path, name):
    (native, ours), last = _both(spark, tmp_path, name)
    assert checkpoint_files(spark, f"{ours}/state/0/*/*.arrowstate.delta")

    def read(**options):
        return _read_both(spark, (native, ours), **options)

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


# string keys (hashed under the manifest's seeds) and keys found by prefix; the other
# families' tiers are the same runs (test_state_tier.py)
@pytest.mark.parametrize("name", ["dedup", "session_window_append"])
def test_readers_read_snapshots_that_name_run_files_as_native(spark, spark_conf, tmp_path,
                                                              name):
    """State on the tier (a worker memory budget) snapshots every version as a manifest
    naming run files; the restarted query takes them back into its tier, and Spark's
    readers read every batch, the change feed, and from every snapshot, as native."""
    spark_conf(**{"spark.arrowstate.worker.memory": "8g",
                  "spark.arrowstate.worker.stateMemoryPercent": "0",
                  "spark.sql.streaming.stateStore.minDeltasForSnapshot": 1})
    (native, ours), last = _both(spark, tmp_path, name)
    assert checkpoint_files(spark, f"{ours}/state/0/*/*.arrowstate.run")

    def read(**options):
        return _read_both(spark, (native, ours), **options)

    for batch in range(last + 1):
        expected, got = read(batchId=batch)
        assert got == expected, batch
    expected, got = read(readChangeFeed=True, changeStartBatchId=0)
    assert got == expected
    for partition in range(2):
        versions = sorted(int(n.split(".")[0]) for n in checkpoint_files(
            spark, f"{ours}/state/0/{partition}/*.arrowstate.snapshot"))
        expected = [r for r in read(batchId=last)[0] if f"partition_id={partition})" in r]
        for version in versions:
            got = _rows(spark.read.format("statestore")
                        .option("snapshotStartBatchId", version - 1)
                        .option("snapshotPartitionId", partition).option("batchId", last)
                        .load(ours))
            assert got == expected, (partition, version)


@pytest.fixture
def sparks_maintenance_restarted(spark):
    """Spark starts its state stores' maintenance task once per JVM, with the interval of the
    first store loaded, and keeps it: stopped (with the stores it holds, none in use between
    tests) before the test, so the test's interval applies, and after, so the next test's
    does (a 100 ms interval left behind made Spark snapshot versions other tests delete)."""
    state_stores = spark._jvm.org.apache.spark.sql.execution.streaming.state.StateStore
    state_stores.stop()
    yield
    state_stores.stop()


def test_reading_from_a_snapshot(spark, spark_conf, tmp_path, sparks_maintenance_restarted):
    """snapshotStartBatchId/snapshotPartitionId: from a snapshot both engines wrote (Spark
    writes them in its maintenance task, so each batch leaves it time to run)."""
    spark_conf(**{"spark.sql.streaming.stateStore.minDeltasForSnapshot": 1,
                  "spark.sql.streaming.stateStore.maintenanceInterval": "100ms"})
    (native, ours), last = _both(spark, tmp_path, "aggregation_update",
                                 between_batches=lambda i, ck: time.sleep(1))

    def snapshots(ck, partition):
        return {int(n.split(".")[0])
                for n in checkpoint_files(spark, f"{ck}/state/0/{partition}/*.snapshot")}

    def from_snapshot(ck, partition, version):
        return _rows(spark.read.format("statestore").option("snapshotStartBatchId", version - 1)
                     .option("snapshotPartitionId", partition).option("batchId", last).load(ck))

    # the engines snapshot different versions (Spark's in its maintenance task); each
    # engine's read from each of its own snapshots must give the partition's state at the
    # last batch, as native Spark reads it
    deadline = time.time() + 20   # snapshots are written off the batch's path
    while time.time() < deadline and not all(snapshots(ours, p) for p in range(2)):
        time.sleep(0.2)
    for partition in range(2):
        expected = [r for r in _rows(spark.read.format("statestore").option("batchId", last)
                                     .load(native)) if f"partition_id={partition})" in r]
        assert snapshots(ours, partition)
        for ck in (native, ours):
            for version in snapshots(ck, partition):
                assert from_snapshot(ck, partition, version) == expected, (ck, version)
    # a version without a snapshot: both refuse it with Spark's error
    for ck in (native, ours):
        missing = min(set(range(1, last + 2)) - snapshots(ck, 0))
        with pytest.raises(Exception, match="CANNOT_READ_MISSING_SNAPSHOT_FILE"):
            from_snapshot(ck, 0, missing)


def test_state_describe_tells_engine_rows_and_schemas(spark, tmp_path):
    """`python -m arrowstate state describe`: arrowstate's rows are the rows Spark's reader
    counts in the native checkpoint of the same query; schemas and layout are Spark's."""
    (native, ours), last = _both(spark, tmp_path, "apply_in_pandas_with_state")
    store = store_options(ours)
    done = subprocess.run([sys.executable, "-m", "arrowstate", "state", "describe", "--json",
                           *store, ours], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    described = json.loads(done.stdout)
    theirs = describe(native)
    assert described["lastCommittedBatch"] == theirs["lastCommittedBatch"] == last
    [op], [native_op] = described["operators"], theirs["operators"]
    assert op["engine"] == "arrowstate" and native_op["engine"] == "spark-hdfs"
    assert op["family"] == "flatMapGroupsWithState" and op["name"] == "applyInPandasWithState"
    assert op["rows"] == spark.read.format("statestore").load(native).count() > 0
    for field in ("partitions", "newest_version", "key_schema", "value_schema", "stores"):
        assert op[field] == native_op[field], field
    text = subprocess.run([sys.executable, "-m", "arrowstate", "state", "describe", *store,
                           ours],
                          capture_output=True, text=True, timeout=120).stdout
    assert f"rows: {op['rows']}" in text and "engine: arrowstate" in text



@pytest.mark.parametrize("name, switch, provider", [
    ("dedup", "spark.arrowstate.enabled", "HDFSBackedStateStoreProvider"),
    ("aggregation_update", "spark.arrowstate.aggregate.enabled", "RocksDBStateStoreProvider")])
@pytest.mark.local_checkpoints
def test_a_query_leaving_arrowstate_continues_on_sparks_operator(spark, spark_conf, tmp_path,
                                                                 name, switch, provider):
    """Restarting an arrowstate checkpoint with arrowstate switched off (at all, or for the
    family) and the jar loaded: the state is converted to Spark's store when the query
    plans its next batch (no manual step), and the query gives, batch for batch, what an
    uninterrupted native run gives. (The other way round, arrowstate adopts Spark's state:
    see the adoption test.)"""
    _provider(spark_conf, provider)
    build, mode = CASES[name]
    native = native_run(spark, tmp_path, EVENTS, BATCHES, build, output_mode=mode,
                        restart_after=[1])
    sessions = spark._jvm.org.apache.spark.sql.classic.SparkSession
    default = sessions.getDefaultSession().get()

    def switch_off(i, checkpoint):
        spark.conf.set(switch, "false")
        return False

    ours = run_query(spark, str(tmp_path), EVENTS, BATCHES, build, arrowstate=True,
                     output_mode=mode, restart_after=[1], on_restart=switch_off)
    assert ours.outputs == native.outputs
    assert ours.figures == native.figures
    assert "runs in arrowstate" in ours.plans[0], ours.plans[0]
    assert "runs in arrowstate" not in ours.plans[-1], ours.plans[-1]
    [moved] = [n for n in os.listdir(ours.checkpoint) if n.startswith("arrowstate-exported-")]
    assert moved == "arrowstate-exported-2"   # the state after the two batches before
    assert describe(ours.checkpoint)["operators"][0]["engine"].startswith("spark")
    # the conversion wraps this driver's SparkContext from a process of its own (the server's
    # log says so in test_connect.py): the driver's default session stays this one
    assert sessions.getDefaultSession().get().equals(default)


HDFS, ROCKSDB = "HDFSBackedStateStoreProvider", "RocksDBStateStoreProvider"
# each command once as users run it, in a process of its own; else in this process
CLI_CASES = {("export", "apply_in_pandas_with_state"), ("import", "dedup_within_watermark"),
             ("repartition", "session_window_append")}


# each direction through both of Spark's stores, and each family once
@pytest.mark.parametrize("command, name, provider", [
    ("export", "apply_in_pandas_with_state", HDFS), ("export", "aggregation_update", ROCKSDB),
    ("import", "dedup_within_watermark", HDFS),
    ("import", "apply_in_pandas_with_state", ROCKSDB),
    ("export", "session_window_append", ROCKSDB), ("import", "session_window_append", HDFS)])
def test_export_and_import_move_a_checkpoint_between_engines(spark, spark_conf, tmp_path,
                                                             command, name, provider):
    """`state export` after two batches run by arrowstate (`import`: by Spark), with the
    state store provider the query records; the query then continues on the other engine
    and gives, batch for batch, what an uninterrupted native run gives. Run again, the
    command has nothing to do."""
    _provider(spark_conf, provider)
    build, mode = CASES[name]
    native = native_run(spark, tmp_path, EVENTS, BATCHES, build, output_mode=mode,
                        restart_after=[1])
    first_on = command == "export"
    said = {}

    def convert_then_switch(i, checkpoint):
        said.update(state_command(command, checkpoint, cli=(command, name) in CLI_CASES))
        spark.conf.set("spark.arrowstate.enabled", str(not first_on).lower())
        return False

    ours = run_query(spark, str(tmp_path), EVENTS, BATCHES, build, arrowstate=first_on,
                     output_mode=mode, restart_after=[1], on_restart=convert_then_switch)
    [converted] = said[command + "ed"]
    assert converted["version"] >= 2 and converted["rows"] > 0
    # as users run it, a local Spark of its own; else this process's session's context
    assert said["session"] == ("local" if (command, name) in CLI_CASES else "active"), said
    assert ours.outputs == native.outputs
    assert ours.figures == native.figures
    before, after = ours.plans[0], ours.plans[-1]
    assert ("Arrow" in before) == first_on and ("Arrow" in after) != first_on, ours.plans
    again = state_command(command, ours.checkpoint)
    assert again[command + "ed"] == [] and "nothing to do" in again["message"]


@pytest.mark.parametrize("name, provider", [
    ("aggregation_update", "HDFSBackedStateStoreProvider"),
    ("apply_in_pandas_with_state", "HDFSBackedStateStoreProvider"),
    ("apply_in_pandas_with_state", "RocksDBStateStoreProvider"),
    ("session_window_append", "RocksDBStateStoreProvider")])
def test_arrowstate_adopts_sparks_state_on_first_load(spark, spark_conf, tmp_path, name,
                                                      provider):
    """A checkpoint Spark's own operators wrote (HDFS-backed or RocksDB store), restarted with
    arrowstate on: the state is converted on the first load, the query gives native answers,
    and the first batch's metrics count the adopted rows."""
    _provider(spark_conf, provider)
    build, mode = CASES[name]
    native = native_run(spark, tmp_path, EVENTS, BATCHES, build, output_mode=mode,
                        restart_after=[1])

    def switch_on(i, checkpoint):
        spark.conf.set("spark.arrowstate.enabled", "true")
        return False

    ours = run_query(spark, str(tmp_path), EVENTS, BATCHES, build, arrowstate=False,
                     output_mode=mode, restart_after=[1], on_restart=switch_on,
                     custom_metrics=["stateRowsAdopted"])
    assert ours.outputs == native.outputs
    assert ours.figures == native.figures
    adopted = {b: c[0]["stateRowsAdopted"] for b, c in ours.custom.items()
               if c[0]["stateRowsAdopted"] is not None}
    first = min(adopted)
    assert adopted[first] > 0 and all(v == 0 for b, v in adopted.items() if b != first), adopted
    assert "Arrow" in ours.plans[-1]


# fewer partitions and more; transformWithState's: test_tws_state_tools.py
@pytest.mark.parametrize("name, partitions", [("apply_in_pandas_with_state", 1),
                                              ("session_window_append", 4)])
@pytest.mark.local_checkpoints
def test_repartition_gives_what_sparks_repartition_gives(spark, spark_conf, tmp_path, name,
                                                         partitions):
    """`state repartition` on an arrowstate checkpoint, and Spark 4.3's own offline
    repartition of it (with RocksDB recorded, Spark writes RocksDB files over arrowstate's,
    which the next batch adopts), against Spark's repartition of the same query's RocksDB
    checkpoint (Spark repartitions RocksDB state only): the same batches follow, with the
    same rows and state figures."""
    spark_conf(**{"spark.sql.streaming.stateStore.providerClass":
                  "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"})
    build, mode = CASES[name]

    repartition_batches, repartitioned = [], []   # per run of Spark's repartition

    def sparks(i, checkpoint):
        spark._streamingCheckpointManager.repartition(checkpoint, partitions)
        repartition_batches.append(max(int(n) for n in os.listdir(f"{checkpoint}/commits")
                                       if n.isdigit()))
        repartitioned.append(_rows(spark.read.format("statestore").load(checkpoint)))
        return False

    native = run_query(spark, str(tmp_path), EVENTS, BATCHES, build, arrowstate=False,
                       output_mode=mode, restart_after=[1], on_restart=sparks)
    said = {}

    def ours(i, checkpoint):
        said.update(state_command("repartition", checkpoint, str(partitions),
                                  cli=("repartition", name) in CLI_CASES))
        said["read"] = _rows(spark.read.format("statestore").load(checkpoint))
        return False

    run = run_query(spark, str(tmp_path), EVENTS, BATCHES, build, arrowstate=True,
                    output_mode=mode, restart_after=[1], on_restart=ours)
    [done] = said["repartitioned"]
    assert said["read"] == repartitioned[0]
    assert len(done["rows"]) == partitions and sum(done["rows"]) > 0
    assert run.outputs == native.outputs
    assert run.figures == native.figures
    assert all("Arrow" in p for p in run.plans)
    by_spark = run_query(spark, str(tmp_path), EVENTS, BATCHES, build, arrowstate=True,
                         output_mode=mode, restart_after=[1], on_restart=sparks,
                         custom_metrics=["stateRowsAdopted"])
    assert by_spark.outputs == native.outputs
    assert by_spark.figures == native.figures
    adopted = {b: sum(p["stateRowsAdopted"] or 0 for p in c)
               for b, c in by_spark.custom.items()}
    first_after = min(b for b in adopted if b > repartition_batches[-1])
    # what Spark's repartition wrote over arrowstate's state reads as on the native checkpoint
    assert repartitioned[-1] == repartitioned[0] and repartitioned[0]
    assert [b for b, n in adopted.items() if n > 0] == [first_after], adopted
    again = state_command("repartition", run.checkpoint, str(partitions))
    assert again["repartitioned"] == [] and "nothing to do" in again["message"]


def _as_spark_3_3_0_recorded_it(checkpoint):
    """Spark before 3.3.1 recorded a dedup operator's value schema as every input column
    (SPARK-39650) while storing an empty row: its schema file, rewritten so."""
    import struct

    for path in glob.glob(os.path.join(checkpoint, "state", "0", "*", "_metadata", "schema")):
        with open(path, "rb") as f:
            assert f.read(4)[2:] in (b"v1", b"v2")
        key = {"type": "struct", "fields": [
            {"name": "user", "type": "string", "nullable": True, "metadata": {}}]}
        value = {"type": "struct", "fields": [
            {"name": n, "type": t, "nullable": True, "metadata": {}}
            for n, t in (("user", "string"), ("ts", "timestamp"), ("v", "long"))]}
        with open(path, "wb") as f:
            for text in ("v1", json.dumps(key), json.dumps(value)):
                data = text.encode()
                f.write(struct.pack(">H", len(data)) + data)
        crc = os.path.join(os.path.dirname(path), ".schema.crc")
        if os.path.exists(crc):
            os.remove(crc)


@pytest.mark.local_checkpoints
def test_dedup_state_recorded_before_spark_3_3_1_is_adopted_as_spark_recovers_it(
        spark, spark_conf, tmp_path):
    """SPARK-39650: a dedup checkpoint whose schema file names every input column as the
    value continues on arrowstate as on Spark (which ignores that value)."""
    _provider(spark_conf, "HDFSBackedStateStoreProvider")
    build, mode = CASES["dedup"]
    runs = {}
    for on in (False, True):
        def rewrite_then_switch(i, checkpoint, on=on):
            _as_spark_3_3_0_recorded_it(checkpoint)
            spark.conf.set("spark.arrowstate.enabled", str(on).lower())
            return False
        runs[on] = run_query(spark, str(tmp_path), EVENTS, BATCHES, build, arrowstate=False,
                             output_mode=mode, restart_after=[1], on_restart=rewrite_then_switch,
                             custom_metrics=["stateRowsAdopted"])
    assert runs[True].outputs == runs[False].outputs
    assert runs[True].figures == runs[False].figures
    assert "ArrowStreamingDeduplicate" in runs[True].plans[-1]
    assert sum(c[0]["stateRowsAdopted"] or 0 for c in runs[True].custom.values()) == 3
