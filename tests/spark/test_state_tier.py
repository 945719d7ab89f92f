"""State beyond memory: under a memory budget, state with fixed-width keys (deduplication,
aggregation, session windows, applyInPandasWithState) lives in sorted runs on the worker's
local disk. Every query here runs with
`stateMemoryPercent` 0, so after each micro-batch all of it moves to disk and the next batch
reads it from there; Spark's own operators are the oracle."""
import datetime as dt
import os
import random
import shutil
import threading
import time

import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout

import fmgws_functions as fns

from harness import assert_same, run_query, spark_errors
from procinfo import kill_own_state_workers
from small_disk import small_disk as mounted_small_disk

DEDUP, SAVE = "ArrowStreamingDeduplicate", "ArrowStateStoreSave"
FLATMAP = "ArrowFlatMapGroupsWithState"
EVENTS = pa.schema([("k", pa.int64()), ("ts", pa.timestamp("us", tz="UTC")),
                    ("v", pa.int64())])


def _batches(count, rows, keys, seed, second0=0, step=20):
    """Rows of `keys` distinct keys (some null), event time advancing `step` s a batch."""
    rng = random.Random(seed)
    out = []
    for b in range(count):
        base = second0 + b * step
        out.append([{"k": None if rng.random() < 0.01 else rng.randrange(keys),
                     "ts": dt.datetime.fromtimestamp(base + rng.randrange(15), dt.timezone.utc),
                     "v": rng.randrange(100)} for _ in range(rows)])
    return out


@pytest.fixture
def tiered(spark_conf, tmp_path):
    """A budget far over what the tests need, with no state kept in memory between batches."""
    local = tmp_path / "local"
    spark_conf(**{"spark.arrowstate.worker.memory": "8g",
                  "spark.arrowstate.worker.stateMemoryPercent": "0",
                  "spark.arrowstate.worker.localDir": str(local)})
    return local


def _on_disk(run):
    return [sum(op["stateDiskBytes"] for op in ops) for ops in run.custom.values()]


def test_deduplication_with_state_on_disk(spark, tmp_path, tiered):
    batches = _batches(5, 6000, 30000, seed=1)
    _, ours = assert_same(spark, tmp_path, EVENTS, batches,
                          lambda df: df.dropDuplicates(["k"]), expect_node=DEDUP,
                          custom_metrics=["numDroppedDuplicateRows", "stateDiskBytes"])
    assert all(_on_disk(ours)[1:]), ours.custom


def test_deduplication_of_keys_that_cannot_be_null_and_of_several_columns(spark, tmp_path,
                                                                           tiered):
    batches = _batches(4, 5000, 20000, seed=2)
    for build in (lambda df: df.select(F.coalesce("k", F.lit(-1)).alias("k"), "v")
                  .dropDuplicates(["k"]),
                  lambda df: df.dropDuplicates(["k", "ts"])):
        _, ours = assert_same(spark, tmp_path, EVENTS, batches, build, expect_node=DEDUP,
                              custom_metrics=["stateDiskBytes"])
        assert all(_on_disk(ours)[1:]), ours.custom


def test_deduplication_with_watermark_evicts_from_disk(spark, tmp_path, tiered):
    batches = _batches(6, 4000, 50000, seed=3) + [[]]
    _, ours = assert_same(
        spark, tmp_path, EVENTS, batches,
        lambda df: df.withWatermark("ts", "10 seconds").dropDuplicates(["k", "ts"]),
        expect_node=DEDUP, custom_metrics=["stateDiskBytes"])
    assert sum(f[0]["numRowsRemoved"] for f in ours.figures.values()) > 0
    _, ours = assert_same(
        spark, tmp_path, EVENTS, batches,
        lambda df: df.withWatermark("ts", "10 seconds").dropDuplicatesWithinWatermark(["k"]),
        expect_node=DEDUP)
    assert sum(f[0]["numRowsRemoved"] for f in ours.figures.values()) > 0


@pytest.mark.parametrize("mode", ["append", "update"])
def test_windowed_aggregation_with_state_on_disk(spark, tmp_path, tiered, mode):
    batches = _batches(6, 5000, 8000, seed=4) + [[]]
    _, ours = assert_same(
        spark, tmp_path, EVENTS, batches,
        lambda df: df.withWatermark("ts", "10 seconds")
                     .groupBy(F.window("ts", "20 seconds"), "k")
                     .agg(F.count("*").alias("n"), F.sum("v").alias("s"), F.max("v")),
        expect_node=SAVE, output_mode=mode, custom_metrics=["stateDiskBytes"])
    assert sum(f[0]["numRowsRemoved"] for f in ours.figures.values()) > 0
    assert any(_on_disk(ours)), ours.custom


def test_complete_aggregation_with_state_on_disk(spark, tmp_path, tiered):
    batches = _batches(4, 5000, 12000, seed=5)
    _, ours = assert_same(spark, tmp_path, EVENTS, batches,
                          lambda df: df.groupBy("k").agg(F.count("*"), F.sum("v"),
                                                         F.avg("v")),
                          expect_node=SAVE, output_mode="complete",
                          custom_metrics=["stateDiskBytes"])
    assert all(_on_disk(ours)[1:]), ours.custom


def test_apply_in_pandas_with_state_and_event_time_timeouts_on_disk(spark, tmp_path, tiered):
    cloudpickle.register_pickle_by_value(fns)
    batches = _batches(5, 800, 1500, seed=9, step=12) + [[]]
    _, ours = assert_same(
        spark, tmp_path, EVENTS, batches,
        lambda df: df.withWatermark("ts", "10 seconds").groupBy("k").applyInPandasWithState(
            fns.event_time_sessions, "user long, what string, value long",
            "count long, latest long", "Update", GroupStateTimeout.EventTimeTimeout),
        expect_node=FLATMAP, output_mode="update", restart_after=[2],
        custom_metrics=["stateDiskBytes"])
    assert sum(f[0]["numRowsRemoved"] for f in ours.figures.values()) > 0
    assert any(_on_disk(ours)), ours.custom


@pytest.mark.parametrize("mode", ["append", "complete"])
def test_session_windows_with_state_on_disk(spark, spark_conf, tmp_path, tiered, mode):
    """Sessions that span batches (a key every few seconds, batches 8 s apart, gap 6 s) and
    Arrow batches (a key's rows cut between them), merged and evicted from disk: the
    grouping keys (a long and a boolean) are the prefix the tier scans."""
    spark_conf(**{"spark.sql.execution.arrow.maxRecordsPerBatch": "500"})
    batches = _batches(6, 3000, 2000, seed=11, step=8) + [[]]
    _, ours = assert_same(
        spark, tmp_path, EVENTS, batches,
        lambda df: df.withWatermark("ts", "10 seconds")
                     .groupBy(F.session_window("ts", "6 seconds"), "k",
                              (F.col("v") % 2 == 0).alias("even"))
                     .agg(F.count("*").alias("n"), F.sum("v").alias("s")),
        expect_node="ArrowSessionWindowStateStoreSave", output_mode=mode, restart_after=[3],
        custom_metrics=["stateDiskBytes"])
    figures = [f[0] for f in ours.figures.values()]
    assert sum(f["numRowsRemoved"] for f in figures) > 0
    assert any(_on_disk(ours)), ours.custom


def _named(df):
    """The long keys as strings of several lengths (a null stays null)."""
    return df.select(F.concat(F.repeat(F.lit("user"), (F.col("k") % 5).cast("int")),
                              F.col("k").cast("string")).alias("u"), "k", "ts", "v")


@pytest.mark.parametrize("query", ["dedup", "aggregate", "sessions"])
def test_string_keys_on_disk(spark, tmp_path, tiered, query):
    """String keys live on the tier by a 128-bit hash of their bytes (and a decimal by its
    bytes): the same answers as Spark's with every key's state on disk."""
    batches = _batches(5, 3000, 4000, seed=12, step=8) + [[]]
    build, node, mode = {
        "dedup": (lambda df: _named(df).withWatermark("ts", "10 seconds")
                  .dropDuplicates(["u", "ts"]), DEDUP, "append"),
        "aggregate": (lambda df: _named(df).groupBy("u", (F.col("v") / 7).cast("decimal(9,1)"))
                      .agg(F.count("*"), F.sum("v")), SAVE, "update"),
        "sessions": (lambda df: _named(df).withWatermark("ts", "10 seconds")
                     .groupBy(F.session_window("ts", "6 seconds"), "u")
                     .agg(F.count("*").alias("n")), "ArrowSessionWindowStateStoreSave",
                     "append"),
    }[query]
    _, ours = assert_same(spark, tmp_path, EVENTS, batches, build, expect_node=node,
                          output_mode=mode, restart_after=[2], custom_metrics=["stateDiskBytes"])
    assert any(_on_disk(ours)), ours.custom


def test_workers_killed_and_query_restarted_rebuild_the_tier_from_the_checkpoint(
        spark, tmp_path, tiered):
    batches = _batches(6, 4000, 20000, seed=6)

    def kill(i, _checkpoint):
        if i in (2, 4):
            kill_own_state_workers()

    _, ours = assert_same(spark, tmp_path, EVENTS, batches,
                          lambda df: df.dropDuplicates(["k"]), expect_node=DEDUP,
                          between_batches=kill, restart_after=[3],
                          custom_metrics=["stateCacheMisses", "stateDiskBytes"])
    assert ours.custom[2][0]["stateCacheMisses"] > 0
    assert all(_on_disk(ours)[1:]), ours.custom


@pytest.mark.local_checkpoints
def test_a_restored_checkpoint_is_loaded_from_its_files_not_from_a_live_tier(
        spark, tmp_path, tiered):
    """An operator restores an older copy of the checkpoint (taken after batch 1) while the
    workers' tiers hold the state of batch 3: the restarted query reloads each partition
    from the restored files (a new run never takes a tier's rows) and re-runs batches 2
    and 3 as Spark does, with Spark's answers."""
    batches = _batches(6, 3000, 8000, seed=13)

    def restore(i, checkpoint):
        backup = checkpoint + ".backup"
        if i == 1:
            shutil.copytree(checkpoint, backup)
        elif i == 3:
            shutil.rmtree(checkpoint)
            shutil.copytree(backup, checkpoint)
        return False

    _, ours = assert_same(spark, tmp_path, EVENTS, batches,
                          lambda df: df.groupBy("k").agg(F.count("*"), F.sum("v")),
                          expect_node=SAVE, output_mode="update", restart_after=[1, 3],
                          on_restart=restore,
                          custom_metrics=["stateCacheMisses", "stateDiskBytes"])
    assert [b for b, _ in ours.history] == [0, 1, 2, 3, 2, 3, 4, 5]
    assert ours.custom[2][0]["stateCacheMisses"] > 0   # the re-run batch 2: from files
    assert all(_on_disk(ours)[1:]), ours.custom


@pytest.mark.local_checkpoints
def test_a_worker_killed_while_it_writes_to_the_tier_loses_nothing(spark, spark_conf,
                                                                   tmp_path):
    """Runs over 1 MiB go to disk in the middle of a batch here: the workers are killed as
    soon as a run file appears, and the task's retry continues from the checkpoint."""
    local = tmp_path / "local"
    spark_conf(**{"spark.arrowstate.worker.memory": "8g",
                  "spark.arrowstate.worker.stateMemoryPercent": "0",
                  "spark.arrowstate.worker.localDir": str(local)})
    batches = _batches(4, 60000, 1_000_000, seed=10)
    killed = []

    def kill_when_writing(i, _checkpoint):
        if i != 2 or spark.conf.get("spark.arrowstate.enabled") != "true":
            return   # the native run (the harness calls this in both) has nothing to kill
        stop = time.monotonic() + 60

        def run_files():
            return {os.path.join(d, n) for d, _, names in os.walk(local) for n in names
                    if n.endswith((".arrow", ".keys"))}

        before = run_files()   # earlier batches' runs: the watch waits for a new one

        def watch():
            while time.monotonic() < stop:
                if run_files() - before and kill_own_state_workers():
                    killed.append(True)
                    return
                time.sleep(0.002)

        threading.Thread(target=watch, daemon=True).start()

    _, ours = assert_same(spark, tmp_path, EVENTS, batches, lambda df: df.dropDuplicates(["k"]),
                          expect_node=DEDUP, between_batches=kill_when_writing,
                          custom_metrics=["stateCacheMisses"])
    assert killed, "no worker was writing to the tier"
    assert ours.custom[2][0]["stateCacheMisses"] or ours.custom[3][0]["stateCacheMisses"], \
        "the state was not reloaded from the checkpoint after the kill"


def test_budget_below_the_workers_base_size_fails_naming_the_setting(spark, spark_conf,
                                                                    tmp_path):
    spark_conf(**{"spark.arrowstate.worker.memory": "8m",
                  "spark.arrowstate.worker.localDir": str(tmp_path / "local")})
    with pytest.raises(StreamingQueryException) as failure:
        run_query(spark, str(tmp_path), EVENTS, _batches(1, 100, 100, seed=7),
                  lambda df: df.dropDuplicates(["k"]), arrowstate=True)
    found = spark_errors(failure.value)
    assert "ARROWSTATE_MEMORY_BUDGET_TOO_SMALL" in found, found
    parameters = found["ARROWSTATE_MEMORY_BUDGET_TOO_SMALL"]["parameters"]
    assert parameters["setting"] == "spark.arrowstate.worker.memory"
    assert int(parameters["needed"]) > int(parameters["budget"]) == 8 << 20


def test_a_working_set_over_the_budget_fails_naming_the_setting_and_its_peak(
        spark, spark_conf, tmp_path):
    """A transformWithState key whose list grows by 3M values in one batch: its decoded
    values (the batch's working set) cannot leave memory, so the task fails, naming the
    setting and the peak it reached, rather than the worker passing its budget."""
    import tws_processors as procs
    cloudpickle.register_pickle_by_value(procs)
    spark_conf(**{"spark.arrowstate.worker.memory": "300m",
                  "spark.arrowstate.worker.localDir": str(tmp_path / "local"),
                  "spark.sql.streaming.stateStore.providerClass":
                      "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"})
    rows = [{"k": 1, "ts": dt.datetime.fromtimestamp(0, dt.timezone.utc), "v": 1}]
    with pytest.raises(StreamingQueryException) as failure:
        run_query(spark, str(tmp_path), EVENTS, [rows],
                  lambda df: df.select(F.col("k").cast("string").alias("user"), "v")
                  .groupBy("user").transformWithStateInPandas(
                      procs.LongList(3_000_000), "user string, count long", "Update", "None"),
                  arrowstate=True, output_mode="update")
    found = spark_errors(failure.value)
    assert "ARROWSTATE_MEMORY_BUDGET_TOO_SMALL" in found, found
    parameters = found["ARROWSTATE_MEMORY_BUDGET_TOO_SMALL"]["parameters"]
    assert parameters["setting"] == "spark.arrowstate.worker.memory"
    assert int(parameters["needed"]) > int(parameters["budget"]) == 300 << 20


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB filesystem of its own (tmpfs; root only)."""
    with mounted_small_disk(tmp_path / "small-disk", "1m") as mount:
        yield mount


def test_a_full_local_disk_fails_clearly_and_the_restart_continues(spark, spark_conf,
                                                                   tmp_path, small_disk):
    spark_conf(**{"spark.arrowstate.worker.memory": "8g",
                  "spark.arrowstate.worker.stateMemoryPercent": "0",
                  "spark.arrowstate.worker.localDir": str(small_disk)})
    batches = _batches(5, 20000, 400000, seed=8)
    failures = []

    def recover(failure):
        # the operator frees room (here: points the tier at a roomy disk) and restarts
        failures.append(failure)
        spark.conf.set("spark.arrowstate.worker.localDir", str(tmp_path / "roomy"))

    spark_run = run_query(spark, str(tmp_path), EVENTS, batches,
                          lambda df: df.dropDuplicates(["k"]), arrowstate=False)
    ours = run_query(spark, str(tmp_path), EVENTS, batches, lambda df: df.dropDuplicates(["k"]),
                     arrowstate=True, recover=recover)
    assert failures, "the small disk did not fill"
    found = spark_errors(failures[0])
    assert "ARROWSTATE_LOCAL_STATE_WRITE_FAILED" in found, found
    parameters = found["ARROWSTATE_LOCAL_STATE_WRITE_FAILED"]["parameters"]
    assert parameters["path"].startswith(str(small_disk))
    assert parameters["setting"] == "spark.arrowstate.worker.localDir"
    assert "full" in parameters["reason"]
    from harness import assert_runs_same
    assert_runs_same(spark_run, ours, DEDUP)
