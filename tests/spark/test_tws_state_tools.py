"""The state commands on transformWithState state: `state import` adopts the state Spark's
operator wrote (RocksDB column families), `state repartition` spreads arrowstate's over
another number of partitions, and a query restarted with arrowstate off for the family has
it converted back to Spark's at planning (`state export` does the same offline); against
Spark's own run of the same query, repartitioned by Spark's own offline repartition, the
batches after give the same rows and state figures, and Spark's `statestore` reader reads
the same state from both checkpoints."""
import glob
import os

import pytest
from pyspark import cloudpickle
from pyspark.errors import StreamingQueryException

import tws_processors as procs
from arrowstate.spark_state import describe
from harness import (EVENTS, assert_state_reads_same, ev, read_state, run_query,
                     spark_errors, state_command, ttl_masked)

cloudpickle.register_pickle_by_value(procs)

BATCHES = [[ev("a", 10, 1), ev("b", 12, 2), ev("a", 13, 1)], [ev("a", 20, 3), ev("c", 30)],
           [ev("b", 40, 2), ev("a", 41)], [ev("a", 42), ev("b", 43), ev(None, 44, 2)],
           [ev("b", 60, 2), ev("c", 61, 2)]]
PARTITIONS = 2   # the shuffle partitions the query starts with; both repartitions make 3

# every kind of state at once: a value, lists and maps with and without TTL, timers
QUERY = (lambda df: df.groupBy("user").transformWithState(
    procs.TimersWithTTL(), procs.SESSION_OUTPUT, "Update", "ProcessingTime"))
VARIABLES = ["count", "recent", "by_size", "sizes", "seen"]


def _state_at(spark, checkpoint, batch, variables=VARIABLES):
    """Every variable's rows and the timers at `batch`, as Spark's reader gives them."""
    return [read_state(spark, checkpoint, batch, options)
            for options in [{"stateVarName": v} for v in variables]
            + [{"readRegisteredTimers": "true"}]]


@pytest.mark.local_checkpoints
def test_import_repartition_and_export_continue_as_spark(spark, spark_conf, tmp_path):
    spark_conf(**{"spark.sql.streaming.stateStore.providerClass":
                  "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
                  "spark.sql.shuffle.partitions": PARTITIONS,
                  # ProcessingTime queries run a batch on every trigger otherwise
                  "spark.sql.streaming.noDataMicroBatches.enabled": "false"})

    def sparks(i, checkpoint):   # after batch 2: Spark's own repartition, to 3
        if i == 2:
            spark._streamingCheckpointManager.repartition(checkpoint, 3)
        return False

    native = run_query(spark, str(tmp_path), EVENTS, BATCHES, QUERY, arrowstate=False,
                       output_mode="update", restart_after=[1, 2, 3], on_restart=sparks)
    said = {}

    def ours(i, checkpoint):   # after batch 1 Spark's state is imported; after 2, ours is
        if i == 1:            # repartitioned; after 3, arrowstate is switched off for the
            # family, and the query converts its state back to Spark's at planning
            said.update(state_command("import", checkpoint))
            spark.conf.set("spark.arrowstate.enabled", "true")
        elif i == 2:
            said.update(state_command("repartition", checkpoint, "3"))
        else:
            said["exported_batch"] = describe(checkpoint)["lastCommittedBatch"]
            said["before_export"] = _state_at(spark, checkpoint, said["exported_batch"])
            spark.conf.set("spark.arrowstate.transformWithState.enabled", "false")
        return False

    run = run_query(spark, str(tmp_path), EVENTS, BATCHES, QUERY, arrowstate=False,
                    output_mode="update", restart_after=[1, 2, 3], on_restart=ours)
    [imported], [repartitioned] = said["imported"], said["repartitioned"]
    assert imported["rows"] > 0 and len(repartitioned["rows"]) == 3
    assert os.path.isdir(os.path.join(run.checkpoint,
                                      f"arrowstate-exported-{said['exported_batch'] + 1}"))
    # exported as it was: every value, list element, map entry, TTL expiry and timer
    assert _state_at(spark, run.checkpoint, said["exported_batch"]) == said["before_export"]
    assert run.outputs == native.outputs
    assert run.figures == native.figures
    assert ["runs in arrowstate" in p for p in run.plans] == [False, True, True, False]
    last = max(run.outputs)
    assert assert_state_reads_same(spark, native, run, [last - 1, last], VARIABLES,
                                   timers=True, masked=ttl_masked)
    described = state_command("describe", run.checkpoint)["operators"][0]
    assert described["family"] == "transformWithState" and described["engine"] == "spark-rocksdb"
    assert described["partitions"] == 3


def test_export_of_state_arrowstate_kept_with_the_hdfs_provider(spark, spark_conf, tmp_path):
    """arrowstate runs transformWithState on the provider a query records, Spark's default
    HDFS-backed one included; Spark runs it on RocksDB only. Export writes the state for
    RocksDB and records that provider in the offset log, and the query goes on on Spark's
    operator as Spark's own run (on RocksDB) does."""
    def query(df):
        return df.groupBy("user").transformWithStateInPandas(
            procs.RunningCount(), "user string, count long", "Update", "None")

    said = {}

    def export(i, checkpoint):
        said.update(state_command("export", checkpoint))
        spark.conf.set("spark.arrowstate.enabled", "false")
        return False

    run = run_query(spark, str(tmp_path), EVENTS, BATCHES[:3], query, arrowstate=True,
                    output_mode="update", restart_after=[1], on_restart=export)
    assert "offsets/1 now records spark.sql.streaming.stateStore.providerClass=" \
           "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider" \
        in said["message"], said
    spark_conf(**{"spark.sql.streaming.stateStore.providerClass":
                  "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"})
    native = run_query(spark, str(tmp_path), EVENTS, BATCHES[:3], query, arrowstate=False,
                       output_mode="update", restart_after=[1])
    assert run.outputs == native.outputs
    assert run.figures == native.figures
    assert "Arrow" in run.plans[0] and "Arrow" not in run.plans[-1], run.plans


@pytest.mark.local_checkpoints
def test_leaving_is_refused_at_planning_where_spark_could_not_run_it(spark, tmp_path):
    """transformWithState state arrowstate kept with the HDFS-backed provider, restarted with
    arrowstate off: Spark runs transformWithState on RocksDB only and this run's provider is
    already the recorded one, so the conversion at planning refuses, the query fails with
    ARROWSTATE_STATE_NEEDS_EXPORT saying why and what to do, and nothing is changed."""
    def query(df):
        return df.groupBy("user").transformWithStateInPandas(
            procs.RunningCount(), "user string, count long", "Update", "None")

    def switch_off(i, checkpoint):
        spark.conf.set("spark.arrowstate.enabled", "false")
        return False

    with pytest.raises(StreamingQueryException) as failed:
        run_query(spark, str(tmp_path), EVENTS, BATCHES[:3], query, arrowstate=True,
                  output_mode="update", restart_after=[1], on_restart=switch_off)
    error = spark_errors(failed.value)["ARROWSTATE_STATE_NEEDS_EXPORT"]
    assert error["parameters"]["operatorId"] == "0"
    assert "RocksDBStateStoreProvider only" in str(failed.value)
    assert "python -m arrowstate state export" in str(failed.value)
    [checkpoint] = glob.glob(os.path.join(str(tmp_path), "run*-on", "ck"))
    assert not glob.glob(os.path.join(checkpoint, "arrowstate-exported-*"))
    assert describe(checkpoint)["operators"][0]["engine"] == "arrowstate"


def test_export_of_event_time_timers_continues_as_spark(spark, spark_conf, tmp_path):
    """Event-time timers (another pair of Spark's column families) and the Row API: exported
    after batch 2, the query goes on on Spark's operator as Spark's own run does, and the
    exported state reads as arrowstate's did."""
    spark_conf(**{"spark.sql.streaming.stateStore.providerClass":
                  "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"})
    batches = [[ev("a", 10), ev("b", 12)], [ev("a", 20), ev("c", 30)], [],
               [ev("b", 40), ev("a", 41)], [ev("d", 60)]]

    def query(df):
        return df.withWatermark("ts", "2 seconds").groupBy("user").transformWithState(
            procs.SessionTimeoutRows(), procs.SESSION_OUTPUT, "Append", "EventTime")

    native = run_query(spark, str(tmp_path), EVENTS, batches, query, arrowstate=False,
                       restart_after=[2])
    said = {}

    def export(i, checkpoint):
        said["batch"] = describe(checkpoint)["lastCommittedBatch"]
        said["before"] = _state_at(spark, checkpoint, said["batch"], ["count"])
        said.update(state_command("export", checkpoint))
        spark.conf.set("spark.arrowstate.enabled", "false")
        return False

    run = run_query(spark, str(tmp_path), EVENTS, batches, query, arrowstate=True,
                    restart_after=[2], on_restart=export)
    assert said["exported"][0]["rows"] > 0
    assert any("timers [" in r[2] for rows in native.outputs.values() for r in rows)
    assert run.outputs == native.outputs
    assert run.figures == native.figures
    assert "Arrow" in run.plans[0] and "Arrow" not in run.plans[-1], run.plans
    assert _state_at(spark, run.checkpoint, said["batch"], ["count"]) == said["before"]
