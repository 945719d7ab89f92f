"""Streaming deduplication: arrowstate against Spark's own operator."""
import datetime as dt
import decimal
import glob
import os

import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException

from procinfo import kill_own_state_workers
from harness import assert_same, run_query, spark_errors

NODE = "ArrowStreamingDeduplicate"
EVENTS = pa.schema([("user", pa.string()), ("ts", pa.timestamp("us", tz="UTC")),
                    ("v", pa.int64())])


def ev(user, second, v=0):
    return {"user": user, "ts": dt.datetime.fromtimestamp(second, dt.timezone.utc), "v": v}


def test_no_watermark_with_empty_batch_and_null_keys(spark, tmp_path):
    batches = [
        [ev("a", 1, 1), ev("b", 2, 2), ev("a", 3, 3)],
        [ev("a", 4), ev("c", 5), ev(None, 6), ev(None, 7)],
        [],
        [ev("d", 8), ev("b", 9), ev(None, 10)],
    ]
    assert_same(spark, tmp_path, EVENTS, batches,
                lambda df: df.dropDuplicates(["user"]), expect_node=NODE,
                custom_metrics=["numDroppedDuplicateRows"])


def test_watermark_late_rows_and_eviction_in_no_data_batches(spark, tmp_path):
    batches = [
        [ev("a", 10), ev("b", 11), ev("a", 10)],
        [ev("a", 10), ev("c", 40), ev("d", 12)],   # moves the watermark to 30 s
        [ev("e", 5), ev("f", 31), ev("c", 40)],   # e is late
        [ev("g", 100)],                            # evicts everything before 90 s
        [ev("a", 10), ev("h", 95), ev("g", 100)],
    ]
    _, ours = assert_same(
        spark, tmp_path, EVENTS, batches,
        lambda df: df.withWatermark("ts", "10 seconds").dropDuplicates(["user", "ts"]),
        expect_node=NODE, custom_metrics=["numDroppedDuplicateRows"])
    assert len(ours.outputs) > len(batches), "no no-data batch ran"
    assert sum(f[0]["numRowsRemoved"] for f in ours.figures.values()) > 0
    assert sum(f[0]["numRowsDroppedByWatermark"] for f in ours.figures.values()) > 0


def test_within_watermark(spark, tmp_path):
    batches = [
        [ev("a", 10, 1), ev("a", 12, 2), ev("b", 11)],
        [ev("a", 25, 3), ev("c", 60)],
        [ev("a", 61), ev("b", 2), ev("d", 62)],
        [ev("a", 200)],
    ]
    _, ours = assert_same(
        spark, tmp_path, EVENTS, batches,
        lambda df: df.withWatermark("ts", "10 seconds")
                     .dropDuplicatesWithinWatermark(["user"]),
        expect_node=NODE)
    # a key's first row may be late where a later one is not: no pass before the shuffle
    assert not any(FIRST_ROWS in plan for plan in ours.plans)


FIRST_ROWS = "ArrowFirstRowPerKey"


def test_repeated_keys_dropped_before_the_shuffle(spark, tmp_path):
    """Each key's first row is the one kept when the map side drops a batch's repeated keys
    before the shuffle; the rows it drops count as the operator's dropped duplicates."""
    users = ["a", "b", "c", "d", "e", None]
    batches = [
        [ev(users[(i * 7) % 6], i, i) for i in range(60)],
        [ev(users[(i * 5) % 4 + 2], 100 + i, 100 + i) for i in range(30)] + [ev("f", 200, 7)],
        # a late key twice (with a watermark): Spark counts both rows as dropped by it
        [ev("f", 300, 8), ev("g", 301, 9), ev("g", 302, 10), ev("a", 5, 11), ev("a", 5, 12)],
    ]
    native, ours = assert_same(spark, tmp_path, EVENTS, batches,
                               lambda df: df.dropDuplicates(["user"]), expect_node=FIRST_ROWS,
                               custom_metrics=["numDroppedDuplicateRows"])
    assert ours.custom == native.custom
    # 96 rows, 8 keys (None is one)
    assert sum(c[0]["numDroppedDuplicateRows"] for c in ours.custom.values()) == 96 - 8
    # with event time among the keys, lateness follows the key: the pass applies
    _, windowed = assert_same(
        spark, tmp_path, EVENTS, batches,
        lambda df: df.withWatermark("ts", "10 seconds").dropDuplicates(["user", "ts"]),
        expect_node=FIRST_ROWS, custom_metrics=["numDroppedDuplicateRows"])
    # late: the first batch's row at second 0 (watermark 0) and the last batch's two
    assert sum(f[0]["numRowsDroppedByWatermark"] for f in windowed.figures.values()) == 3


def test_restart_mid_stream_from_checkpoint(spark, tmp_path):
    batches = [
        [ev("a", 10), ev("b", 11)],
        [ev("a", 10), ev("c", 40)],
        [ev("a", 10), ev("b", 11), ev("d", 41)],
        [ev("c", 40), ev("e", 90)],
        [ev("d", 41), ev("f", 91)],
    ]
    _, ours = assert_same(
        spark, tmp_path, EVENTS, batches,
        lambda df: df.withWatermark("ts", "100 seconds").dropDuplicates(["user", "ts"]),
        expect_node=NODE, restart_after=[1, 3], custom_metrics=["stateCacheHits"])


KEY_CASES = {
    "long": (pa.int64(), [5, None, 7, 5, None, -1]),
    "timestamp": (pa.timestamp("us", tz="UTC"),
                  [dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc), None,
                   dt.datetime(2024, 1, 1, 0, 0, 1, tzinfo=dt.timezone.utc),
                   dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc), None, None]),
    "decimal": (pa.decimal128(12, 3),
                [decimal.Decimal("1.500"), None, decimal.Decimal("-2.000"),
                 decimal.Decimal("1.500"), decimal.Decimal("0.001"), None]),
    "struct": (pa.struct([("x", pa.int32()), ("y", pa.string())]),
               [{"x": 1, "y": "a"}, None, {"x": None, "y": None}, {"x": 1, "y": "a"},
                {"x": None, "y": None}, {"x": 2, "y": None}]),
    "double": (pa.float64(), [0.0, -0.0, float("nan"), float("nan"), None, 1.5]),
    "date_and_string": (pa.date32(), [dt.date(2020, 1, 1), None, dt.date(2020, 1, 2),
                                      dt.date(2020, 1, 1), None, dt.date(1969, 12, 31)]),
}


@pytest.mark.parametrize("case", sorted(KEY_CASES))
def test_key_types(spark, tmp_path, case):
    key_type, values = KEY_CASES[case]
    schema = pa.schema([("k", key_type), ("s", pa.string()), ("n", pa.int64())])
    rows = [{"k": v, "s": "x" if i % 2 else None, "n": i} for i, v in enumerate(values)]
    batches = [rows[:3], rows[3:], rows]
    keys = ["k", "s"] if case == "date_and_string" else ["k"]
    assert_same(spark, tmp_path, schema, batches,
                lambda df: df.dropDuplicates(keys), expect_node=NODE)


def test_switched_off_family_stays_spark_with_reason(spark, spark_conf, tmp_path):
    spark_conf(**{"spark.arrowstate.deduplicate.enabled": "false"})
    run = run_query(spark, str(tmp_path), EVENTS, [[ev("a", 1)], [ev("a", 2)]],
                    lambda df: df.dropDuplicates(["user"]), arrowstate=True)
    assert run.outputs == {0: [("a", dt.datetime(1970, 1, 1, 0, 0, 1), 0)], 1: []}
    assert all("ArrowStateFallback [reason: spark.arrowstate.deduplicate.enabled=false]"
               in p and "StreamingDeduplicate" in p for p in run.plans)


def test_unsupported_key_type_falls_back_with_reason(spark, tmp_path):
    schema = pa.schema([("k", pa.list_(pa.float64())), ("n", pa.int64())])
    batches = [[{"k": [1.0], "n": 1}, {"k": [1.0], "n": 2}], [{"k": [2.0], "n": 3}]]
    spark_run, ours = assert_same(spark, tmp_path, schema, batches,
                                  lambda df: df.dropDuplicates(["k"]), expect_node=None)
    assert all("ArrowStateFallback [reason: column k: unsupported type ARRAY<DOUBLE>"
               in p for p in ours.plans), ours.plans


def test_killed_worker_fails_the_task_and_the_retry_reloads_from_checkpoint(spark, tmp_path):
    batches = [[ev("a", 1), ev("b", 2)], [ev("a", 1), ev("c", 3)],
               [ev("b", 2), ev("c", 3), ev("d", 4)], [ev("d", 4), ev("e", 5)]]

    def kill_before_third(i, _checkpoint):
        if i == 2:  # in the run with arrowstate off there is nothing to kill
            kill_own_state_workers()

    _, ours = assert_same(spark, tmp_path, EVENTS, batches,
                          lambda df: df.dropDuplicates(["user", "ts"]), expect_node=NODE,
                          custom_metrics=["stateCacheHits", "stateCacheMisses"],
                          between_batches=kill_before_third)
    assert ours.custom[1][0]["stateCacheMisses"] == 0, "steady state must not reload"
    assert ours.custom[2][0]["stateCacheMisses"] > 0, "the retry must reload from files"


@pytest.mark.local_checkpoints
def test_corrupt_state_file_fails_loudly_naming_it(spark, tmp_path):
    batches = [[ev("a", 1)], [ev("b", 2)], [ev("c", 3)]]
    corrupted = []

    def corrupt_before_third(i, checkpoint):
        if i == 2:
            kill_own_state_workers()
            for path in glob.glob(os.path.join(checkpoint, "state", "0", "*",
                                               "2.arrowstate.delta")):
                with open(path, "wb") as f:
                    f.write(b"not arrow")
                corrupted.append(path)

    with pytest.raises(StreamingQueryException) as failure:
        run_query(spark, str(tmp_path), EVENTS, batches,
                  lambda df: df.dropDuplicates(["user"]), arrowstate=True,
                  between_batches=corrupt_before_third)
    assert corrupted
    error = spark_errors(failure.value)["CANNOT_LOAD_STATE_STORE.CORRUPT_STATE_FILE"]
    assert any(error["parameters"]["path"].endswith(c) for c in corrupted), error
    message = str(failure.value)
    assert "Python traceback of the arrowstate state worker" in message
    assert "Traceback" in message and "2.arrowstate.delta" in message


@pytest.mark.local_checkpoints
def test_snapshots_and_retention(spark, spark_conf, tmp_path):
    spark_conf(**{"spark.sql.streaming.stateStore.minDeltasForSnapshot": 3,
                  "spark.sql.streaming.minBatchesToRetain": 4})
    batches = [[ev(f"u{i}", i), ev(f"u{i - 1}", i)] for i in range(1, 12)]
    run_query(spark, str(tmp_path), EVENTS, batches,
              lambda df: df.dropDuplicates(["user"]), arrowstate=True)
    # snapshots are written and old files pruned by the maintenance thread, off the batch
    spark._jvm.org.apache.spark.sql.arrowstate.store.StateMaintenance.awaitIdle()
    state_dirs = glob.glob(os.path.join(str(tmp_path), "*-on", "ck", "state", "0", "[0-9]*"))
    assert state_dirs
    for d in state_dirs:
        names = sorted(os.listdir(d))
        versions = {int(n.split(".")[0]) for n in names if n.endswith(".arrowstate.delta")}
        snapshots = {int(n.split(".")[0]) for n in names if n.endswith(".arrowstate.snapshot")}
        assert snapshots and max(versions) == 11
        assert min(versions) > 1, f"old deltas were not cleaned: {names}"
        # every retained version is loadable: a snapshot at or below it, deltas after
        for v in range(11 - 4 + 1, 12):
            base = max(s for s in snapshots if s <= v)
            assert all(x in versions for x in range(base + 1, v + 1)), names
        assert not any(n.endswith((".delta", ".snapshot")) and "arrowstate" not in n
                       for n in names), "Spark's own store files must not appear"


def test_reloaded_state_still_evicts_by_watermark(spark, tmp_path):
    """A worker that reloads state from files rebuilds its eviction index."""
    batches = [
        [ev("a", 10), ev("b", 11)],
        [ev("c", 40), ev("a", 12)],
        [ev("d", 200), ev("b", 11)],     # after the reload: evicts a, b, c
        [ev("a", 10), ev("e", 201)],
    ]

    def kill_before_third(i, _checkpoint):
        if i == 2:
            kill_own_state_workers()

    _, ours = assert_same(
        spark, tmp_path, EVENTS, batches,
        lambda df: df.withWatermark("ts", "10 seconds").dropDuplicates(["user", "ts"]),
        expect_node=NODE, custom_metrics=["stateCacheMisses"],
        between_batches=kill_before_third)
    # batch ids run ahead of file numbers here: no-data batches run when the watermark moves
    assert any(c[0]["stateCacheMisses"] for bid, c in ours.custom.items() if bid > 0)
    assert sum(f[0]["numRowsRemoved"] for f in ours.figures.values()) >= 3
