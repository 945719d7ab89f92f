"""The state commands on transformWithState state: `state import` adopts the state Spark's
operator wrote (RocksDB column families) and `state repartition` spreads arrowstate's over
another number of partitions; against Spark's own run of the same query, repartitioned by
Spark's own offline repartition, the batches after give the same rows and state figures,
and Spark's `statestore` reader reads the same state from both checkpoints."""
import datetime as dt

import pyarrow as pa
from pyspark import cloudpickle

import tws_processors as procs
from harness import assert_state_reads_same, run_query, state_command, ttl_masked

cloudpickle.register_pickle_by_value(procs)

EVENTS = pa.schema([("user", pa.string()), ("ts", pa.timestamp("us", tz="UTC")),
                    ("v", pa.int64())])


def ev(user, second, v=1):
    return {"user": user, "ts": dt.datetime.fromtimestamp(second, dt.timezone.utc), "v": v}


BATCHES = [[ev("a", 10, 1), ev("b", 12, 2), ev("a", 13, 1)], [ev("a", 20, 3), ev("c", 30)],
           [ev("b", 40, 2), ev("a", 41)], [ev("a", 42), ev("b", 43), ev(None, 44, 2)],
           [ev("b", 60, 2), ev("c", 61, 2)]]
PARTITIONS = 2   # the shuffle partitions the query starts with; both repartitions make 3

# every kind of state at once: a value, lists and maps with and without TTL, timers
QUERY = (lambda df: df.groupBy("user").transformWithState(
    procs.TimersWithTTL(), procs.SESSION_OUTPUT, "Update", "ProcessingTime"))
VARIABLES = ["count", "recent", "by_size", "sizes", "seen"]


def test_import_then_repartition_continue_as_spark(spark, spark_conf, tmp_path):
    spark_conf(**{"spark.sql.streaming.stateStore.providerClass":
                  "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
                  "spark.sql.shuffle.partitions": PARTITIONS,
                  # ProcessingTime queries run a batch on every trigger otherwise
                  "spark.sql.streaming.noDataMicroBatches.enabled": "false"})

    def sparks(i, checkpoint):   # after batch 3: Spark's own repartition, to 3
        if i == 3:
            spark._streamingCheckpointManager.repartition(checkpoint, 3)
        return False

    native = run_query(spark, str(tmp_path), EVENTS, BATCHES, QUERY, arrowstate=False,
                       output_mode="update", restart_after=[1, 3], on_restart=sparks)
    said = {}

    def ours(i, checkpoint):   # after batch 1 Spark's state is imported; after 3, ours
        if i == 1:            # is repartitioned
            said.update(state_command("import", checkpoint))
            spark.conf.set("spark.arrowstate.enabled", "true")
        else:
            said.update(state_command("repartition", checkpoint, "3"))
        return False

    run = run_query(spark, str(tmp_path), EVENTS, BATCHES, QUERY, arrowstate=False,
                    output_mode="update", restart_after=[1, 3], on_restart=ours)
    [imported], [repartitioned] = said["imported"], said["repartitioned"]
    assert imported["rows"] > 0 and len(repartitioned["rows"]) == 3
    assert run.outputs == native.outputs
    assert run.figures == native.figures
    assert "Arrow" not in run.plans[0] and all("Arrow" in p for p in run.plans[1:]), run.plans
    last = max(run.outputs)
    assert assert_state_reads_same(spark, native, run, [last - 1, last], VARIABLES,
                                   timers=True, masked=ttl_masked)
    described = state_command("describe", run.checkpoint)["operators"][0]
    assert described["family"] == "transformWithState" and described["engine"] == "arrowstate"
    assert described["partitions"] == 3
