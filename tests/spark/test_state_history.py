"""`state history` against Spark: per committed batch and operator, the rows it reads from
the checkpoint alone (total, updated, removed) are those the query's progress reported
(`stateOperators`), for deduplication and aggregation in one query, applyInPandasWithState
and transformWithState (values, lists, maps, TTLs, timers); `state describe` names each
transformWithState variable."""

from pyspark import cloudpickle

import fmgws_functions as fns
import tws_processors as procs
from arrowstate.spark_state import history
from harness import EVENTS, ev, run_query, state_command

cloudpickle.register_pickle_by_value(fns)
cloudpickle.register_pickle_by_value(procs)

BATCHES = [[ev("a", 10, 1), ev("b", 12, 2), ev("a", 13, 1)], [ev("a", 20, 3), ev("c", 30)],
           [ev("b", 40, 2), ev("a", 41)], [ev("a", 42), ev("b", 43), ev("d", 44, 2)],
           [ev("b", 60, 2), ev("c", 61, 2), ev("e", 62)]]
FIGURES = ("numRowsTotal", "numRowsUpdated", "numRowsRemoved")


def assert_history_is_progress(run, operators: int) -> dict:
    """The history's rows per batch and operator are the progress's, its durations within
    the progress's; every operator has bytes on disk."""
    h = history(run.checkpoint)
    assert run.figures, "the query reported no state operators"
    read = {b["batchId"]: b for b in h["batches"]}
    for bid, reported in run.figures.items():
        got = read[bid]["operators"]
        assert len(got) == operators == len(reported)
        assert [{k: o[k] for k in FIGURES} for o in got] == \
            [{k: o[k] for k in FIGURES} for o in reported], f"batch {bid}"
        assert all(o["engine"] == "arrowstate" and o["bytesOnDisk"] > 0 and o["note"] is None
                   for o in got), got
        # from the offset log's batchTimestampMs to the commit: within Spark's trigger
        # execution (which also asks the sources for offsets first), beyond its addBatch;
        # to within half a second where the store keeps file times to the second (S3)
        took, slack = run.durations[bid], h["timeResolutionMs"] // 2
        assert took["addBatch"] - slack <= read[bid]["durationMs"] \
            <= took["triggerExecution"] + 2 + slack, (read[bid]["durationMs"], took)
    assert h["uncommittedBatches"] == []
    return h


def test_history_of_deduplication_and_aggregation(spark, tmp_path):
    def build(df):   # two operators, the second's rows depend on the first's
        return df.dropDuplicates(["user", "v"]).groupBy("user").count()

    run = run_query(spark, str(tmp_path), EVENTS, BATCHES, build, arrowstate=True,
                    output_mode="update", restart_after=[2])
    h = assert_history_is_progress(run, operators=2)
    assert [o["name"] for o in h["operators"]] == ["stateStoreSave", "dedupe"]
    assert state_command("history", run.checkpoint, "--json", cli=True) == h


def test_history_of_windowed_aggregation_with_eviction_and_of_spark_own_state(spark, tmp_path):
    """Append mode evicts closed windows (removed rows, no-data batches); the same query on
    Spark's own store: rows not available, said so, bytes read from its files."""
    from pyspark.sql import functions as F

    def build(df):
        return (df.withWatermark("ts", "5 seconds")
                .groupBy(F.window("ts", "10 seconds"), "user").count())

    ours = run_query(spark, str(tmp_path), EVENTS, BATCHES, build, arrowstate=True)
    assert_history_is_progress(ours, operators=1)
    assert any(o[0]["numRowsRemoved"] for o in ours.figures.values())
    theirs = run_query(spark, str(tmp_path), EVENTS, BATCHES, build, arrowstate=False)
    native = history(theirs.checkpoint)
    assert [b["batchId"] for b in native["batches"]] == sorted(theirs.figures)
    for b in native["batches"]:
        [o] = b["operators"]
        assert o["engine"] == "spark-hdfs" and o["numRowsTotal"] is None
        assert "record no state figures" in o["note"] and o["bytesOnDisk"] > 0


def test_history_of_apply_in_pandas_with_state(spark, tmp_path):
    def build(df):   # removes a key's state every third call: removed rows too
        return df.groupBy("user").applyInPandasWithState(
            fns.remove_on_third, "user string, calls long, rows long, exists boolean",
            "calls long", "Update", "NoTimeout")

    run = run_query(spark, str(tmp_path), EVENTS, BATCHES, build, arrowstate=True,
                    output_mode="update")
    assert_history_is_progress(run, operators=1)
    assert any(o[0]["numRowsRemoved"] for o in run.figures.values())


def test_history_and_describe_of_transform_with_state(spark, spark_conf, tmp_path):
    spark_conf(**{"spark.sql.streaming.stateStore.providerClass":
                  "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
                  # ProcessingTime queries run a batch on every trigger otherwise
                  "spark.sql.streaming.noDataMicroBatches.enabled": "false"})

    def build(df):   # a value, lists and maps with and without TTL, timers
        return df.groupBy("user").transformWithState(
            procs.TimersWithTTL(), procs.SESSION_OUTPUT, "Update", "ProcessingTime")

    run = run_query(spark, str(tmp_path), EVENTS, BATCHES, build, arrowstate=True,
                    output_mode="update", restart_after=[1])
    assert_history_is_progress(run, operators=1)
    assert any(o[0]["numRowsRemoved"] for o in run.figures.values())
    described = state_command("describe", run.checkpoint)["operators"][0]
    variables = {v["name"]: v for v in described["state_variables"]}
    assert variables["count"] == {"name": "count", "kind": "value", "ttl": True,
                                  "schema": "struct<n:bigint>"}
    assert variables["by_size"] == {"name": "by_size", "kind": "map", "ttl": True,
                                    "key_schema": "struct<n:bigint>",
                                    "schema": "struct<total:bigint>"}
    assert variables["sizes"] == {"name": "sizes", "kind": "list", "ttl": False,
                                  "schema": "struct<n:bigint,at:timestamp>"}
    assert sorted(variables) == ["by_size", "count", "recent", "seen", "sizes"]
    assert described["timers"]["time_mode"] == "ProcessingTime"
    assert described["family"] == "transformWithState" and "timers" in described["holds"]
