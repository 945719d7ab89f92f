"""Session window aggregation (`session_window`): arrowstate against Spark's own
SessionWindowStateStoreRestoreExec / MergingSessionsExec / SessionWindowStateStoreSaveExec.

The scenarios follow Spark's StreamingSessionWindowSuite: sessions that merge within a batch
and across batches (a row between two stored sessions joins them), rows a late row would
extend (dropped and counted), several keys, eviction by the watermark in no-data batches,
restarts from the checkpoint, append and complete mode (Spark refuses update mode)."""
import datetime as dt

import pyarrow as pa
import pytest
from pyspark.errors import AnalysisException, StreamingQueryException
from pyspark.sql import functions as F

import harness
from arrowstate.spark_state import describe
from harness import assert_same, run_query

SAVE, RESTORE = "ArrowSessionWindowStateStoreSave", "ArrowSessionWindowStateStoreRestore"
EVENTS = pa.schema([("user", pa.string()), ("ts", pa.timestamp("us", tz="UTC")),
                    ("v", pa.int64()), ("word", pa.string())])


def ev(user, second, v=1, word=None):
    return {"user": user, "ts": dt.datetime.fromtimestamp(second, dt.timezone.utc), "v": v,
            "word": word}


# gap 10 s, watermark delay 10 s; what happens in append mode (complete mode evicts nothing,
# and runs no no-data batches, so its late-events watermark lags)
SESSIONS = [
    # a: [1, 11) and [30, 40); b: [2, 12); c: [5, 15) and [16, 26) (15 < 16: two sessions)
    [ev("a", 1), ev("b", 2, 5), ev("a", 30, 2), ev("c", 5), ev("c", 16, 3)],
    # (no-data batch, watermark 20 s: a [1, 11), b [2, 12), c [5, 15) evicted)
    # a@20 joins the stored [30, 40) as [20, 40) (start 30 removed); b@10 would extend b's
    # evicted session and is late ([10, 20) ends at the watermark); d is new
    [ev("a", 20, 4), ev("b", 10), ev("d", 50, 7)],
    # (watermark 40 s: c [16, 26), a [20, 40) evicted) a@35 is in time ([35, 45)), c@3 late,
    # d@55 extends d to [50, 65)
    [ev("a", 35), ev("c", 3, 9), ev("d", 55)],
    [],
    # (watermark 45 s: a [35, 45) evicted) d@44 joins d's stored session from before its
    # start ([44, 65), start 50 removed), d@58 falls inside; e is new
    [ev("e", 100), ev("d", 44), ev("d", 58, 2)],
    # (watermark 90 s: d [44, 68) evicted) e@104 extends e, e@120 starts another session
    [ev("e", 104), ev("e", 120)],
]


@pytest.fixture(autouse=True)
def _operator_figures_too(monkeypatch):
    """Here the figures also include those Spark's session window save sets by mode (in
    complete mode it leaves numStateStoreInstances at 0)."""
    monkeypatch.setattr(harness, "STATE_FIGURES", harness.STATE_FIGURES + (
        "numShufflePartitions", "numStateStoreInstances"))


def session_counts(df, gap="10 seconds"):
    return (df.withWatermark("ts", "10 seconds")
            .groupBy(F.session_window("ts", gap), "user")
            .agg(F.count("*").alias("n"), F.sum("v").alias("s")))


@pytest.mark.parametrize("mode", ["append", "complete"])
def test_sessions_merge_across_batches_late_rows_are_dropped(spark, tmp_path, mode):
    _, ours = assert_same(spark, tmp_path, EVENTS, SESSIONS, session_counts,
                          expect_node=SAVE, output_mode=mode)
    assert all(RESTORE in plan for plan in ours.plans)
    assert all("MergingSessions" in plan for plan in ours.plans)   # Spark's, kept
    # Spark's final aggregate over the save's sessions (one row each) runs in the save
    assert all("finishing count(1), sum(v" in plan and "HashAggregate(keys=[session_window"
               not in plan.split(SAVE)[0] for plan in ours.plans)
    figures = [f[0] for f in ours.figures.values()]
    assert sum(f["numRowsDroppedByWatermark"] for f in figures) == (2 if mode == "append" else 1)
    removed = sum(f["numRowsRemoved"] for f in figures)   # merged away (2), evicted
    if mode == "append":
        assert len(ours.outputs) > len(SESSIONS), "no no-data batch ran"
        assert removed == 2 + sum(len(rows) for rows in ours.outputs.values()) == 2 + 7
    else:
        assert removed == 2


def test_restarts_from_the_checkpoint_give_the_same_answers(spark, tmp_path):
    native, ours = assert_same(spark, tmp_path, EVENTS, SESSIONS, session_counts,
                               expect_node=SAVE, output_mode="append", restart_after=[0, 1, 3])
    [op] = describe(ours.checkpoint)["operators"]
    assert (op["name"], op["family"], op["engine"]) == (
        "sessionWindowStateStoreSaveExec", "sessionWindow", "arrowstate")
    assert op["rows"] == spark.read.format("statestore").load(native.checkpoint).count() == 2


def test_deduplicated_rows_then_sessions_two_operators(spark, tmp_path):
    def build(df):
        return (df.withWatermark("ts", "10 seconds").dropDuplicates(["user", "ts"])
                .groupBy(F.session_window("ts", "10 seconds"), "user")
                .agg(F.count("*").alias("n"), F.sum("v").alias("s")))

    _, ours = assert_same(spark, tmp_path, EVENTS, SESSIONS + [[ev("e", 120), ev("e", 121)]],
                          build, expect_node=SAVE, output_mode="append", restart_after=[2])
    assert all("ArrowStreamingDeduplicate" in plan for plan in ours.plans)
    assert all(len(f) == 2 for f in ours.figures.values())


def test_unsupported_buffer_stays_spark_with_reason(spark, tmp_path):
    def interval_buffer(df):
        return (df.withWatermark("ts", "10 seconds")
                .groupBy(F.session_window("ts", "10 seconds"), "user")
                .agg(F.max(F.make_dt_interval(secs=F.col("v"))).cast("string").alias("m")))

    _, ours = assert_same(spark, tmp_path, EVENTS, SESSIONS[:3], interval_buffer,
                          expect_node=None, output_mode="append")
    assert all("ArrowStateFallback [reason: session column" in p and "INTERVAL" in p
               for p in ours.plans), ours.plans
    assert not any(SAVE in p or RESTORE in p for p in ours.plans)


def test_complete_mode_without_watermark_restarts(spark, tmp_path):
    def build(df):
        return (df.groupBy("user", F.session_window("ts", "5 seconds"))
                .agg(F.count("*").alias("n"), F.max("v").alias("m")))

    assert_same(spark, tmp_path, EVENTS, SESSIONS, build, expect_node=SAVE,
                output_mode="complete", restart_after=[1])


def test_many_rows_of_one_key_span_arrow_batches(spark, spark_conf, tmp_path):
    """With three rows per Arrow batch, a key's rows and sessions cross batch boundaries in
    both halves: stored sessions wait for the key's next rows."""
    spark_conf(**{"spark.sql.execution.arrow.maxRecordsPerBatch": "3"})
    def rows(user, *seconds):   # v tells the rows apart: the lists show the merge order
        return [ev(user, t, v=t) for t in seconds]

    batches = [
        rows("a", 1, 5, 40, 80, 120) + rows("b", 2, 60, 61),
        # a: between, before, after and into stored sessions; b: one extended, one new
        # (b@60 again: a stored session goes before an input row of the same start)
        rows("a", 0, 3, 30, 45, 46, 100, 118, 200) + rows("b", 7, 90) + [ev("b", 60, 600)],
        rows("a", 210, 215, 300) + rows("b", 95) + rows("c", 300),
        [],
        rows("a", 305, 306, 307, 308, 309, 310, 400),
    ]

    def build(df):
        return (df.withWatermark("ts", "30 seconds")
                .groupBy(F.session_window("ts", "10 seconds"), "user")
                .agg(F.count("*").alias("n"), F.collect_list("v").alias("in_order"),
                     F.first("v").alias("first"), F.last("v").alias("last")))

    for mode in ("append", "complete"):
        assert_same(spark, tmp_path / mode, EVENTS, batches, build, expect_node=SAVE,
                    output_mode=mode, restart_after=[1])


def test_several_keys_and_functions_dynamic_gap(spark, tmp_path):
    """Two grouping keys, a gap that depends on the row (Spark's dynamic gap), functions whose
    buffers are arrays and structs."""
    batches = [
        [ev("a", 1, 1, "x"), ev("a", 2, 2, "y"), ev("b", 3, 3, "x"), ev("a", 9, 4, "x")],
        [ev("a", 12, 5, "x"), ev("b", 6, 6, "y"), ev(None, 7, 7, None), ev(None, 8, 8, None)],
        [ev("a", 4, 9, "y"), ev("c", 60, 1, "z"), ev("b", 61, 2, "x")],
        [],
        [ev("a", 120, 3, "x")],
    ]

    def build(df):
        gap = F.when(F.col("word") == "x", "5 seconds").otherwise("2 seconds")
        return (df.withWatermark("ts", "10 seconds")
                .groupBy(F.session_window("ts", gap), "user", "word")
                .agg(F.count("*").alias("n"), F.sort_array(F.collect_list("v")).alias("vs"),
                     F.max(F.struct("v", "ts")).alias("latest"), F.avg("v").alias("mean")))

    assert_same(spark, tmp_path, EVENTS, batches, build, expect_node=SAVE,
                output_mode="append", restart_after=[2])


def test_event_time_column_other_than_the_session(spark, spark_conf, tmp_path):
    """Grouped by the watermarked column too, ahead of the session (Spark allows two event
    time columns only with a single stateful operator, as before 3.4): Spark judges late
    rows and evicts by the first one; it reaches the restore beside the keys and the
    session."""
    spark_conf(**{"spark.sql.streaming.statefulOperator.allowMultiple": "false"})
    def build(df):
        return (df.withWatermark("ts", "10 seconds")
                .groupBy("ts", F.session_window("ts", "10 seconds"), "user")
                .agg(F.count("*").alias("n"), F.sum("v").alias("s")))

    _, ours = assert_same(spark, tmp_path, EVENTS, SESSIONS + [[ev("a", 30, 5)]], build,
                          expect_node=SAVE, output_mode="append", restart_after=[2])
    assert sum(f[0]["numRowsDroppedByWatermark"] for f in ours.figures.values()) > 0


def test_sessions_merged_within_the_partition_before_the_shuffle(spark, spark_conf, tmp_path):
    spark_conf(**{"spark.sql.streaming.sessionWindow.merge.sessions.in.local.partition":
                  "true"})
    assert_same(spark, tmp_path, EVENTS, SESSIONS, session_counts, expect_node=SAVE,
                output_mode="append")


def test_update_mode_is_refused_as_spark_refuses_it(spark, tmp_path):
    for on in (False, True):
        with pytest.raises((AnalysisException, StreamingQueryException),
                           match="STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION"):
            run_query(spark, str(tmp_path / str(on)), EVENTS, SESSIONS[:1], session_counts,
                      arrowstate=on, output_mode="update")


def test_switched_off_session_windows_stay_spark(spark, spark_conf, tmp_path):
    spark_conf(**{"spark.arrowstate.sessionWindow.enabled": "false"})
    run = run_query(spark, str(tmp_path), EVENTS, SESSIONS[:2], session_counts,
                    arrowstate=True, output_mode="append")
    assert all("spark.arrowstate.sessionWindow.enabled=false" in p for p in run.plans)
    assert not any(SAVE in p for p in run.plans)
