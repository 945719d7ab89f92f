"""applyInPandasWithState: arrowstate against Spark's own FlatMapGroupsInPandasWithStateExec."""
import datetime as dt
import time

import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming.state import GroupStateTimeout

import fmgws_functions as fns
from harness import assert_same, run_query

cloudpickle.register_pickle_by_value(fns)

NODE = "ArrowFlatMapGroupsWithState"
EVENTS = pa.schema([("user", pa.string()), ("ts", pa.timestamp("us", tz="UTC")),
                    ("v", pa.int64())])


def ev(user, second, v=1):
    return {"user": user, "ts": dt.datetime.fromtimestamp(second, dt.timezone.utc), "v": v}


def apply(func, output, state, timeout=GroupStateTimeout.NoTimeout, watermark=False,
          mode="Update"):
    def build(df):
        if watermark:
            df = df.withWatermark("ts", "10 seconds")
        return df.groupBy("user").applyInPandasWithState(func, output, state, mode, timeout)
    return build


def test_no_timeout_running_count_with_restart(spark, tmp_path):
    batches = [[ev("a", 1), ev("b", 2), ev("a", 3)], [ev("a", 4), ev("c", 5)], [],
               [ev("b", 6), ev("b", 7), ev(None, 8)]]
    assert_same(spark, tmp_path, EVENTS, batches,
                apply(fns.running_count, "user string, count long", "count long"),
                expect_node=NODE, output_mode="update", restart_after=[1])


def test_processing_time_timeout_fires_in_a_batch_without_data_for_the_group(
        spark, spark_conf, tmp_path):
    # Batches run only when data comes (no endless no-data batches for processing-time
    # timeouts), 1.5 s apart: a 1 s timeout fires in the next batch that lacks the group.
    spark_conf(**{"spark.sql.streaming.noDataMicroBatches.enabled": "false"})
    batches = [[ev("a", 1, 2), ev("b", 2, 3)], [ev("a", 3, 4)], [ev("c", 4)],
               [ev("c", 5), ev("b", 6)], [ev("a", 6)]]
    _, ours = assert_same(
        spark, tmp_path, EVENTS, batches,
        apply(fns.session_with_processing_timeout,
              "user string, total long, timedOut boolean", "total long",
              GroupStateTimeout.ProcessingTimeTimeout),
        expect_node=NODE, output_mode="update",
        between_batches=lambda i, _: time.sleep(1.5 if i else 0))
    timed_out = {row[0] for rows in ours.outputs.values() for row in rows if row[2]}
    assert timed_out == {"a", "b", "c"}


def test_event_time_timeout_with_late_rows_and_several_output_rows(spark, tmp_path):
    batches = [[ev("a", 1), ev("b", 2), ev("a", 5)],
               [ev("c", 40), ev("a", 6)],          # watermark -> 30 s: a and b time out
               [ev("a", 3), ev("c", 41), ev("d", 42)],   # a@3 is late
               [ev("e", 100)],                     # closes c and d
               [ev("a", 101)]]
    _, ours = assert_same(
        spark, tmp_path, EVENTS, batches,
        apply(fns.event_time_sessions, "user string, what string, value long",
              "count long, latest long", GroupStateTimeout.EventTimeTimeout, watermark=True),
        expect_node=NODE, output_mode="update", restart_after=[2])
    closed = [r for rows in ours.outputs.values() for r in rows if r[1] == "closed"]
    assert len(closed) >= 4
    assert sum(f[0]["numRowsDroppedByWatermark"] for f in ours.figures.values()) > 0


def test_state_removal_and_recreation_across_restart(spark, tmp_path):
    batches = [[ev("a", i) for i in range(1, 3)], [ev("a", 3)], [ev("a", 4), ev("b", 4)],
               [ev("a", 5)], [ev("a", 6), ev("b", 6)], [ev("a", 7)]]
    _, ours = assert_same(
        spark, tmp_path, EVENTS, batches,
        apply(fns.remove_on_third, "user string, calls long, rows long, exists boolean",
              "calls long"),
        expect_node=NODE, output_mode="update", restart_after=[1, 3])
    assert sum(f[0]["numRowsRemoved"] for f in ours.figures.values()) > 0


def test_large_groups_arrive_in_chunks_and_partial_reads(spark, spark_conf, tmp_path):
    spark_conf(**{"spark.sql.execution.arrow.maxRecordsPerBatch": 3})
    batches = [[ev("a", i) for i in range(8)] + [ev("b", 1), ev("c", 2)],
               [ev("b", i) for i in range(5)]]
    assert_same(spark, tmp_path, EVENTS, batches,
                apply(fns.first_chunk_only, "user string, first long", "first long",
                      mode="Append"),
                expect_node=NODE, output_mode="append")


def test_output_frames_of_differing_shapes_are_joined_as_pandas_would(spark, tmp_path):
    batches = [[ev("a", 1), ev("b", 2), ev("c", 3), ev("d", 4)], [ev("a", 5), ev("e", 6)]]
    assert_same(spark, tmp_path, EVENTS, batches,
                apply(fns.mixed_output_frames, "user string, count long", "n long"),
                expect_node=NODE, output_mode="update")


def test_group_state_misuse_raises_as_in_pyspark(spark, tmp_path):
    batches = [[ev("a", 1), ev("b", 2)], [ev("a", 3)]]
    assert_same(spark, tmp_path, EVENTS, batches,
                apply(fns.misuses_state, "user string, errors string, processingTime boolean",
                      "n long"),
                expect_node=NODE, output_mode="update")


@pytest.mark.local_checkpoints
def test_failing_function_fails_the_query_with_its_traceback_and_commits_nothing(
        spark, tmp_path):
    batches = [[ev("a", 1)], [ev("boom", 2)]]
    with pytest.raises(StreamingQueryException) as failure:
        run_query(spark, str(tmp_path), EVENTS, batches,
                  apply(fns.fails_on_boom, "user string, count long", "n long"),
                  arrowstate=True, output_mode="update")
    message = str(failure.value)
    assert "the user function failed on purpose" in message and "fails_on_boom" in message
    commits = sorted(p.name for p in tmp_path.glob("run*-on/ck/commits/[0-9]*"))
    assert commits == ["0"], commits
    # the partition whose function failed wrote no version 2 (the others may have: like
    # Spark's stores, they are overwritten when the batch runs again)
    partitions = list(tmp_path.glob("run*-on/ck/state/0/[0-9]*"))
    failed = [p for p in partitions if not (p / "2.arrowstate.delta").exists()]
    assert len(partitions) == 2 and failed, partitions


def test_state_values_come_back_in_pysparks_form(spark, tmp_path):
    batches = [[ev("a", 1), ev("b", 2)], [ev("a", 5), ev("b", 1)], [ev("a", 3)]]
    assert_same(spark, tmp_path, EVENTS, batches,
                apply(fns.keeps_latest_timestamp, "user string, latest string, stored_as string",
                      "latest timestamp"),
                expect_node=NODE, output_mode="update", restart_after=[1])
