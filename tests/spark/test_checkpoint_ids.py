"""Spark's state checkpoint format v2 (spark.sql.streaming.stateStore.checkpointFormatVersion=2,
which real-time mode sets): arrowstate operators report each partition's checkpoint id to the
commit log, as Spark's RocksDB store does, and load only the version the log names."""
import json
import os
import uuid

import pytest
from pyspark import cloudpickle
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

import fmgws_functions as fns
import tws_processors as procs
from harness import (EVENTS, assert_runs_same, assert_same, ev, native_run, read_state,
                     run_query, spark_errors, state_command)
from procinfo import kill_own_state_workers
from test_state_history import assert_history_is_progress

cloudpickle.register_pickle_by_value(fns)
cloudpickle.register_pickle_by_value(procs)

V2 = {"spark.sql.streaming.stateStore.checkpointFormatVersion": "2",
      # the store Spark's format v2 needs, for the oracle's runs
      "spark.sql.streaming.stateStore.providerClass":
          "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"}
BATCHES = [[ev("a", 1, 1), ev("b", 2, 2)], [ev("a", 3, 3), ev("c", 4, 1)], [],
           [ev("b", 5, 4), ev("d", 6, 2)]]

QUERIES = {
    "dedup": (lambda df: df.dropDuplicates(["user"]), "ArrowStreamingDeduplicate", "append"),
    "aggregate": (lambda df: df.groupBy("user").agg(F.sum("v").alias("s")),
                  "ArrowStateStoreSave", "update"),
    "applyInPandasWithState": (
        lambda df: df.groupBy("user").applyInPandasWithState(
            fns.running_count, "user string, count long", "count long", "Update",
            "NoTimeout"), "ArrowFlatMapGroupsWithState", "update"),
    "transformWithStateInPandas": (
        lambda df: df.groupBy("user").transformWithStateInPandas(
            procs.EveryVariable(), procs.EVERY_VARIABLE_OUTPUT, "Append", "None"),
        "ArrowTransformWithState", "append"),
}


def _commit_ids(checkpoint: str, batch: int) -> dict:
    """The state checkpoint ids the commit log recorded for a batch, by operator."""
    with open(os.path.join(checkpoint, "commits", str(batch))) as f:
        lines = f.read().splitlines()
    return json.loads(lines[1]).get("stateUniqueIds", {})


# deduplication, applyInPandasWithState and transformWithState(InPandas) run on format v2 in
# test_real_time.py too (real-time mode sets it): aggregation here, and each of the others
# here where a change needs them
@pytest.mark.parametrize("name", ["aggregate"])
def test_format_v2_runs_with_spark_answers_across_a_restart(spark, spark_conf, tmp_path, name):
    spark_conf(**V2)
    build, node, mode = QUERIES[name]
    native, ours = assert_same(spark, tmp_path, EVENTS, BATCHES, build, expect_node=node,
                               output_mode=mode, restart_after=[1])
    if name != "transformWithStateInPandas":   # (its variables: test_transform_with_state)
        # Spark's reader, given the commit log's ids, reads arrowstate's state as Spark's
        for batch in (1, 3):
            assert (read_state(spark, ours.checkpoint, batch, {})
                    == read_state(spark, native.checkpoint, batch, {}))
    # one id per partition, each naming the delta that batch wrote and its unique id
    ids = _commit_ids(ours.checkpoint, 3)["0"]
    assert len(ids) == 2 and all(len(p) == 1 for p in ids), ids
    for partition, (ckpt_id,) in enumerate(ids):
        delta = os.path.join(ours.checkpoint, "state", "0", str(partition),
                             f"4_{ckpt_id}.arrowstate.delta")
        with open(delta, "rb") as f:
            assert uuid.UUID(ckpt_id).bytes in f.read()[-60:]


def test_an_id_the_commit_log_names_that_no_file_has_fails_naming_the_file(
        spark, spark_conf, tmp_path):
    """The commit log names an attempt whose files are not there (lost, or a log edited):
    the load fails naming the delta it needs, and never takes another attempt's."""
    spark_conf(**V2)
    build, _, mode = QUERIES["dedup"]
    missing_id = str(uuid.uuid4())

    def other_id_in_the_log(i, checkpoint):
        # what the log holds when another attempt's delta replaced the committed one
        path = os.path.join(checkpoint, "commits", "1")
        with open(path) as f:
            head, meta = f.read().splitlines()
        meta = json.loads(meta)
        meta["stateUniqueIds"]["0"][1] = [missing_id]
        with open(path, "w") as f:
            f.write(head + "\n" + json.dumps(meta))
        for crc in os.listdir(os.path.join(checkpoint, "commits")):
            if crc.endswith(".crc"):
                os.remove(os.path.join(checkpoint, "commits", crc))

    with pytest.raises(StreamingQueryException) as failed:
        run_query(spark, str(tmp_path), EVENTS, BATCHES, build, arrowstate=True,
                  output_mode=mode, restart_after=[1], on_restart=other_id_in_the_log)
    errors = spark_errors(failed.value)
    missing = errors.get("CANNOT_LOAD_STATE_STORE.CANNOT_READ_DELTA_FILE_NOT_EXISTS")
    assert missing is not None, errors
    assert f"2_{missing_id}.arrowstate.delta" in str(failed.value)


def test_leaving_arrowstate_on_format_v2_fails_saying_why(spark, spark_conf, tmp_path):
    """Spark's commit log names arrowstate's checkpoint ids: Spark's store could load no
    version converted for it, so the query says so rather than fail in Spark's store."""
    spark_conf(**V2)
    build, _, mode = QUERIES["aggregate"]

    def leave(i, checkpoint):
        spark.conf.set("spark.arrowstate.enabled", "false")

    with pytest.raises(StreamingQueryException) as failed:
        try:
            run_query(spark, str(tmp_path), EVENTS, BATCHES, build, arrowstate=True,
                      output_mode=mode, restart_after=[1], on_restart=leave)
        finally:
            spark.conf.set("spark.arrowstate.enabled", "true")
    errors = spark_errors(failed.value)
    assert "ARROWSTATE_STATE_NEEDS_EXPORT" in errors, errors
    assert "format v2" in str(failed.value)


# Spark's state under format v2 becoming arrowstate's: adopted on the first load, or by
# `state import` between two runs
V2_ADOPTIONS = [("dedup", "first load"), ("aggregate", "first load"),
                ("applyInPandasWithState", "import"), ("aggregate", "import")]


@pytest.mark.parametrize("name, how", V2_ADOPTIONS, ids=[f"{n}-{h}" for n, h in V2_ADOPTIONS])
def test_sparks_format_v2_state_becomes_arrowstates_with_sparks_answers(
        spark, spark_conf, tmp_path, name, how):
    """A checkpoint Spark's RocksDB store wrote under format v2 (as real-time mode makes
    them), continued with arrowstate on, after its state is imported or on its first load:
    the state of the version the commit log names becomes arrowstate's, and the query goes on
    with Spark's answers, across a restart after it."""
    spark_conf(**V2)
    build, node, mode = QUERIES[name]
    native = native_run(spark, tmp_path, EVENTS, BATCHES, build, output_mode=mode,
                        restart_after=[1, 2])
    said = {}

    def switch_on(i, checkpoint):
        if how == "import" and not said:
            said.update(state_command("import", checkpoint))
        spark.conf.set("spark.arrowstate.enabled", "true")
        return False

    ours = run_query(spark, str(tmp_path), EVENTS, BATCHES, build, arrowstate=False,
                     output_mode=mode, restart_after=[1, 2], on_restart=switch_on,
                     custom_metrics=["stateRowsAdopted"])
    assert ours.outputs == native.outputs
    assert ours.figures == native.figures
    assert node in ours.plans[-1]
    adopted = [b for b, c in ours.custom.items() if (c[0]["stateRowsAdopted"] or 0) > 0]
    if how == "import":
        [imported] = said["imported"]
        assert imported["version"] == 2 and imported["rows"] > 0, said
        assert adopted == [], ours.custom
    else:
        assert len(adopted) == 1, ours.custom


# -- late attempts ----------------------------------------------------------------------------
# Spark's promise under format v2: an attempt that did not commit (a zombie or speculative
# task, a stage run again) leaves files beside the committed ones, and no load picks them.

INJECTING = "org.apache.spark.sql.arrowstate.testing.FailureInjectionFileManager"
LATE_QUERIES = dict(QUERIES, session_window=(
    lambda df: df.withWatermark("ts", "10 seconds")
    .groupBy(F.session_window("ts", "5 seconds"), "user").agg(F.count("*").alias("n")),
    "ArrowSessionWindowStateStoreSave", "append"))
# the batches of another attempt of the first three: the third read other input
OTHER_ATTEMPT = BATCHES[:2] + [[ev("z", 4, 9), ev("a", 3, 7), ev("e", 4, 2)]]
SNAPSHOTS = {"deltas": {"spark.sql.streaming.stateStore.minDeltasForSnapshot": 10},
             "snapshots": {"spark.sql.streaming.stateStore.minDeltasForSnapshot": 1},
             # state on the tier: snapshots are manifests naming run files
             "manifests": {"spark.sql.streaming.stateStore.minDeltasForSnapshot": 1,
                           "spark.arrowstate.worker.memory": "8g",
                           "spark.arrowstate.worker.stateMemoryPercent": "0"}}
LATE_CASES = [(name, "snapshots") for name in LATE_QUERIES] + [
    ("dedup", "deltas"), ("dedup", "manifests")]


def copy_absent_files(spark, source_checkpoint: str, checkpoint: str) -> list[str]:
    """Every state file of `source_checkpoint` that `checkpoint` lacks, copied into the same
    operator and partition directory there (nothing is written over), on whichever
    filesystem the checkpoints are; the names copied."""
    jvm = spark._jvm
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    root = jvm.org.apache.hadoop.fs.Path(source_checkpoint + "/state")
    fs = root.getFileSystem(conf)
    copied = []
    for status in fs.globStatus(jvm.org.apache.hadoop.fs.Path(
            source_checkpoint + "/state/*/*/*.arrowstate.*")) or []:
        path = status.getPath()
        part, op = path.getParent().getName(), path.getParent().getParent().getName()
        target = jvm.org.apache.hadoop.fs.Path(f"{checkpoint}/state/{op}/{part}/{path.getName()}")
        if not fs.exists(target):
            jvm.org.apache.hadoop.fs.FileUtil.copy(fs, path, fs, target, False, conf)
            copied.append(path.getName())
    return copied


@pytest.mark.parametrize("name,snapshots", LATE_CASES, ids=[f"{n}-{s}" for n, s in LATE_CASES])
def test_a_late_attempts_files_never_stop_a_load_and_answers_stay_sparks(
        spark, spark_conf, tmp_path, name, snapshots):
    assert_late_attempt_passed_over(spark, spark_conf, tmp_path, name, snapshots)


def assert_late_attempt_passed_over(spark, spark_conf, tmp_path, name, snapshots):
    """Another attempt of the first three batches, whose last read other input, wrote its
    deltas, snapshots (and manifests' run files) after our batch committed: they land in
    our checkpoint under their own names; our workers are lost, so the next batch loads from
    the files: Spark's answers (its RocksDB store under v2, uninterrupted), and again after
    a restart. (test_remote_checkpoints.py runs it on HDFS and S3.)"""
    spark_conf(**V2, **SNAPSHOTS[snapshots])
    build, node, mode = LATE_QUERIES[name]
    native = native_run(spark, tmp_path, EVENTS, BATCHES, build, output_mode=mode,
                        restart_after=[3])
    other = run_query(spark, str(tmp_path), EVENTS, OTHER_ATTEMPT, build, arrowstate=True,
                      output_mode=mode)
    copied = []

    def late_files_land(i, checkpoint):
        if i == 3:   # batches 0-2 committed: the other attempt's files land after them
            copied.extend(copy_absent_files(spark, other.checkpoint, checkpoint))
            kill_own_state_workers()

    ours = run_query(spark, str(tmp_path), EVENTS, BATCHES, build, arrowstate=True,
                     output_mode=mode, between_batches=late_files_land, restart_after=[3])
    assert_runs_same(native, ours, node)
    assert any(".arrowstate.delta" in n for n in copied), copied
    if snapshots != "deltas":
        assert any(".arrowstate.snapshot" in n for n in copied), copied
    if snapshots == "manifests":
        assert any(n.endswith(".arrowstate.run") for n in copied), copied
    if name == "aggregate":   # the state tools read the lineage the commit log names too
        assert_history_is_progress(ours, operators=1)
        described = state_command("describe", ours.checkpoint)["operators"][0]
        assert described["rows"] == ours.figures[max(ours.figures)][0]["numRowsTotal"]


@pytest.mark.local_checkpoints
def test_a_delta_whose_write_lands_after_the_batch_ran_again_is_never_loaded(
        spark, spark_conf, tmp_path):
    """Spark's failure-injection case "job failure with changelog shows up": a task's delta
    write is held back (its close fails), the batch fails, the query restarts and commits
    the batch again with more input, then the held-back delta lands; after the workers are
    lost the query goes on with Spark's answers."""
    spark_conf(**V2, **{"spark.sql.streaming.checkpointFileManagerClass": INJECTING,
                        "spark.sql.streaming.stateStore.minDeltasForSnapshot": 2})
    injection = spark._jvm.org.apache.spark.sql.arrowstate.testing.FailureInjection
    injection.reset()
    build, node, mode = QUERIES["aggregate"]
    native = native_run(spark, tmp_path, EVENTS, BATCHES, build, output_mode=mode)

    def between(i, checkpoint):
        if i == 2:
            injection.arm("delayClose", ".*/state/0/1/3_.*\\.arrowstate\\.delta", 1)
        if i == 3:
            assert injection.releaseDelayed() == 1   # the late attempt's delta lands now
            kill_own_state_workers()

    try:
        ours = run_query(spark, str(tmp_path), EVENTS, BATCHES, build, arrowstate=True,
                         output_mode=mode, between_batches=between,
                         recover=lambda failure: injection.disarm())
        assert injection.failures("delayClose") == 1
    finally:
        injection.reset()
    assert_runs_same(native, ours, node)
    late = [n for n in os.listdir(os.path.join(ours.checkpoint, "state", "0", "1"))
            if n.startswith("3_") and n.endswith(".arrowstate.delta")]
    assert len(late) == 2, late   # the committed attempt's and the late one's
