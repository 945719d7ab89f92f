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
from harness import EVENTS, assert_same, ev, read_state, run_query, spark_errors

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
    # one id per partition, each the unique id of the delta that batch wrote
    ids = _commit_ids(ours.checkpoint, 3)["0"]
    assert len(ids) == 2 and all(len(p) == 1 for p in ids), ids
    for partition, (ckpt_id,) in enumerate(ids):
        delta = os.path.join(ours.checkpoint, "state", "0", str(partition), "4.arrowstate.delta")
        with open(delta, "rb") as f:
            assert uuid.UUID(ckpt_id).bytes in f.read()[-60:]


def test_a_delta_the_commit_log_does_not_name_fails_the_load(spark, spark_conf, tmp_path):
    """A delta rewritten by an attempt whose batch did not commit (a zombie task in real-time
    mode, where two attempts read different input) is refused, never loaded."""
    spark_conf(**V2)
    build, _, mode = QUERIES["dedup"]

    def other_id_in_the_log(i, checkpoint):
        # what the log holds when another attempt's delta replaced the committed one
        path = os.path.join(checkpoint, "commits", "1")
        with open(path) as f:
            head, meta = f.read().splitlines()
        meta = json.loads(meta)
        meta["stateUniqueIds"]["0"][1] = [str(uuid.uuid4())]
        with open(path, "w") as f:
            f.write(head + "\n" + json.dumps(meta))
        for crc in os.listdir(os.path.join(checkpoint, "commits")):
            if crc.endswith(".crc"):
                os.remove(os.path.join(checkpoint, "commits", crc))

    with pytest.raises(StreamingQueryException) as failed:
        run_query(spark, str(tmp_path), EVENTS, BATCHES, build, arrowstate=True,
                  output_mode=mode, restart_after=[1], on_restart=other_id_in_the_log)
    errors = spark_errors(failed.value)
    lineage = errors.get("CANNOT_LOAD_STATE_STORE.INVALID_CHECKPOINT_LINEAGE")
    assert lineage is not None, errors
    assert "2.arrowstate.delta" in lineage["parameters"]["message"], lineage


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
