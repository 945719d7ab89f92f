"""Streaming aggregation: arrowstate against Spark's own restore/save pair."""
import datetime as dt
import decimal

import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from harness import assert_same, run_query, spark_errors

SAVE, RESTORE = "ArrowStateStoreSave", "ArrowStateStoreRestore"
EVENTS = pa.schema([("user", pa.string()), ("ts", pa.timestamp("us", tz="UTC")),
                    ("v", pa.int64()), ("d", pa.decimal128(12, 3)), ("x", pa.float64())])


def ev(user, second, v=1, d=None, x=None):
    return {"user": user, "ts": dt.datetime.fromtimestamp(second, dt.timezone.utc), "v": v,
            "d": None if d is None else decimal.Decimal(d), "x": x}


WINDOWED = [
    [ev("a", 1), ev("b", 2, 5), ev("a", 12, 3)],
    [ev("a", 14, 2), ev("c", 31, 7)],            # watermark -> 21 s: closes [0, 10)
    [ev("a", 3, 9), ev("b", 25), ev("c", 45)],   # a@3 is late; watermark -> 35 s
    [],
    [ev("d", 80, 4), ev("a", 12, 1)],            # watermark -> 70 s, a@12 late
    [ev("e", 81)],
]


def windowed_counts(df):
    return (df.withWatermark("ts", "10 seconds")
            .groupBy(F.window("ts", "10 seconds"), "user")
            .agg(F.count("*").alias("n"), F.sum("v").alias("s")))


@pytest.mark.parametrize("mode", ["append", "update"])
def test_windowed_counts_with_late_rows_and_eviction(spark, tmp_path, mode):
    _, ours = assert_same(spark, tmp_path, EVENTS, WINDOWED, windowed_counts,
                          expect_node=SAVE, output_mode=mode)
    assert all(RESTORE in plan for plan in ours.plans)
    assert len(ours.outputs) > len(WINDOWED), "no no-data batch ran"
    figures = [f[0] for f in ours.figures.values()]
    assert sum(f["numRowsRemoved"] for f in figures) > 0
    assert sum(f["numRowsDroppedByWatermark"] for f in figures) > 0


def test_complete_mode_without_watermark_and_null_keys(spark, tmp_path):
    batches = [
        [ev("a", 1, 1, "1.5", 0.5), ev(None, 2, 2, None, None), ev("a", 3, None, "2.25")],
        [ev("b", 4, 3, "-1", -0.0), ev(None, 5, None)],
        [],
        [ev("a", 6, 4, "0.001", float("nan")), ev("c", 7, 5)],
    ]
    assert_same(spark, tmp_path, EVENTS, batches,
                lambda df: df.groupBy("user").agg(
                    F.count("*"), F.sum("v"), F.avg("v"), F.sum("d"), F.avg("d"),
                    F.min("x"), F.max("x"), F.min("user"), F.max("ts")),
                expect_node=SAVE, output_mode="complete")


def test_many_functions_and_buffer_types_in_update_mode(spark, tmp_path):
    batches = [
        [ev("a", 1, 1, "1.5", 0.5), ev("b", 2, 2, None, 1.0), ev("a", 3, 3, "2.25")],
        [ev("b", 4, 3, "-1", 2.0), ev("a", 5, None, None, None), ev("c", 6, 1)],
        [ev("a", 7, 4, "0.001", 3.0), ev("c", 8, 5), ev("c", 9, 5)],
    ]

    def build(df):
        return (df.groupBy("user").agg(
            F.first("v").alias("first"), F.last("v").alias("last"),
            F.sort_array(F.collect_list("v")).alias("list"),
            F.sort_array(F.collect_set("v")).alias("set"),
            F.approx_count_distinct("v").alias("distinct"),
            F.max(F.struct("v", "user")).alias("max_struct"),
            F.min(F.array("v", "v")).alias("min_array"),
            F.sum("d").alias("sum_d"), F.min("ts").alias("min_ts"),
            F.max(F.create_map(F.lit("k"), F.col("v")).getItem("k")).alias("via_map")))

    assert_same(spark, tmp_path, EVENTS, batches, build, expect_node=SAVE,
                output_mode="update")


# values whose sums and merges show any change of order or of Spark's null, NaN and -0.0 rules
EDGES = [
    [ev("a", 1, 1, "1.5", 0.1), ev("b", 2, None, None, -0.0), ev("a", 3, 3, "2.25", 0.2),
     ev("c", 4, 7, "0.001", float("nan")), ev("d", 5, None, None, None)],
    [ev("a", 6, 4, "-1", 0.3), ev("b", 7, 2, "3", -0.0), ev("e", 8, 1, None, float("inf"))],
    [],
    [ev("a", 9, None, None, None), ev("c", 10, 2, "1", 1.0), ev("d", 11, 5, "2", -0.0),
     ev("e", 12, 1, "1", float("-inf")), ev("b", 13, 1, "0", 1e308), ev("b", 14, 1, "0", 1e308)],
]


def numeric_aggregates(df):
    return df.groupBy("user").agg(
        F.count("*").alias("n"), F.count("x").alias("nx"), F.sum("v").alias("sv"),
        F.sum("x").alias("sx"), F.avg("x").alias("ax"), F.avg("v").alias("av"),
        F.sum("d").alias("sd"), F.avg("d").alias("ad"), F.min("x").alias("lo"),
        F.max("x").alias("hi"), F.stddev("x").alias("sdev"), F.max("ts").alias("last"),
        F.first("x").alias("first"))


@pytest.mark.parametrize("mode", ["update", "complete"])
def test_merges_taken_into_restore_and_save_keep_sparks_answers(spark, tmp_path, mode):
    """Spark's aggregates around the restore and the save run row by row in arrowstate's
    nodes (their keys are unique there) with the functions' own merge expressions: the same
    sums to the last bit, NaN, infinities, -0.0, nulls and decimals, across restarts."""
    _, ours = assert_same(spark, tmp_path, EVENTS, EDGES, numeric_aggregates,
                          expect_node=SAVE, output_mode=mode, restart_after=[1])
    assert all("merging merge_count" in p and "finishing count" in p for p in ours.plans)
    # above the shuffle only Spark's merge of the batch's partial buffers is left
    assert all(p.split("Exchange")[0].count("HashAggregate(") == 1 for p in ours.plans)


def test_windowed_append_merged_and_finished_row_by_row(spark, tmp_path):
    _, ours = assert_same(spark, tmp_path, EVENTS, WINDOWED, windowed_counts,
                          expect_node=SAVE, output_mode="append")
    assert all("merging" in p and "finishing" in p for p in ours.plans)


BIG = pa.schema([("user", pa.string()), ("v", pa.int64()), ("d", pa.decimal128(38, 0))])


def _outcome(spark, tmp_path, batches, build, arrowstate):
    """A run's output per batch, or the error conditions that stopped it."""
    try:
        run = run_query(spark, str(tmp_path), BIG, batches, build, arrowstate=arrowstate,
                        output_mode="update")
    except StreamingQueryException as failed:
        return "failed", sorted(c for c in spark_errors(failed) if "OVERFLOW" in c)
    return "ran", run.outputs


@pytest.mark.parametrize("ansi", ["true", "false"])
@pytest.mark.parametrize("column", ["v", "d"])
def test_overflow_in_merged_sums_as_spark(spark, spark_conf, tmp_path, ansi, column):
    """A sum that overflows only when the stored buffer meets the batch's: with ANSI on the
    query fails with Spark's condition, with it off a long wraps and a decimal becomes null,
    in both engines."""
    spark_conf(**{"spark.sql.ansi.enabled": ansi})
    big = {"v": 2 ** 62, "d": decimal.Decimal("6" + "0" * 37)}[column]
    row = {"user": "a", "v": None, "d": None}
    batches = [[{**row, column: big}], [{**row, column: big}]]
    build = lambda df: df.groupBy("user").agg(F.sum(column).alias("s"))   # noqa: E731
    native = _outcome(spark, tmp_path, batches, build, arrowstate=False)
    ours = _outcome(spark, tmp_path, batches, build, arrowstate=True)
    assert ours == native
    if ansi == "true":
        assert native[0] == "failed" and native[1], native
    else:
        assert native[0] == "ran" and native[1][1] == [("a", {"v": -(2 ** 63), "d": None}[column])]


def test_global_aggregate_restores_state_on_empty_batches(spark, tmp_path):
    batches = [[ev("a", 1, 1), ev("b", 2, 2)], [], [ev("c", 3, 3)], []]
    assert_same(spark, tmp_path, EVENTS, batches,
                lambda df: df.agg(F.count("*").alias("n"), F.sum("v").alias("s")),
                expect_node=SAVE, output_mode="complete")


def test_sliding_windows_grouped_by_window_only_with_restarts(spark, tmp_path):
    def build(df):
        return (df.withWatermark("ts", "5 seconds")
                .groupBy(F.window("ts", "10 seconds", "5 seconds"))
                .agg(F.count("*").alias("n"), F.max("v").alias("m")))

    assert_same(spark, tmp_path, EVENTS, WINDOWED, build, expect_node=SAVE,
                output_mode="append", restart_after=[1, 3])


def test_group_by_event_time_column_in_update_mode(spark, tmp_path):
    assert_same(spark, tmp_path, EVENTS, WINDOWED,
                lambda df: df.withWatermark("ts", "10 seconds").groupBy("ts", "user").count(),
                expect_node=SAVE, output_mode="update", restart_after=[2])


def test_deduplicate_then_aggregate_keep_their_own_state(spark, tmp_path):
    def build(df):
        return (df.withWatermark("ts", "10 seconds").dropDuplicates(["user", "ts"])
                .groupBy(F.window("ts", "10 seconds")).agg(F.count("*").alias("n")))

    _, ours = assert_same(spark, tmp_path, EVENTS, WINDOWED + [[ev("a", 95), ev("a", 95)]],
                          build, expect_node=SAVE, output_mode="append")
    assert all("ArrowStreamingDeduplicate" in plan for plan in ours.plans)
    assert all(len(f) == 2 for f in ours.figures.values())


def test_unsupported_buffer_stays_spark_with_reason(spark, tmp_path):
    batches = [[ev("a", 1, 1), ev("a", 2, 2)], [ev("a", 30, 1)]]

    def interval_buffer(df):
        return (df.groupBy("user")
                .agg(F.max(F.make_dt_interval(secs=F.col("v"))).cast("string").alias("m")))

    _, ours = assert_same(spark, tmp_path, EVENTS, batches, interval_buffer,
                          expect_node=None, output_mode="update")
    assert all("ArrowStateFallback [reason: aggregation buffer" in p for p in ours.plans)
    assert not any(SAVE in p for p in ours.plans)


def test_switched_off_aggregation_stays_spark(spark, spark_conf, tmp_path):
    spark_conf(**{"spark.arrowstate.aggregate.enabled": "false"})
    run = run_query(spark, str(tmp_path), EVENTS, WINDOWED[:2], windowed_counts,
                    arrowstate=True, output_mode="update")
    assert all("spark.arrowstate.aggregate.enabled=false" in p for p in run.plans)
    assert not any(SAVE in p for p in run.plans)
