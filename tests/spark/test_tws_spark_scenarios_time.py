"""The timer, TTL and initial-state scenarios of Spark's own PySpark transformWithState
tests, run differentially: each query runs on Spark (the oracle) and on arrowstate, and
every batch's rows, state figures and the operator's metrics must match; Spark's run is
also held to what Spark's test expects of it. The time mode None scenarios without an
initial state are in test_tws_spark_scenarios.py (same style, same input).

Spark's tests (apache/spark, python/pyspark/sql/tests/pandas/streaming/):
  test_pandas_transform_with_state.py                  (pandas API; Row API twins in
  test_pandas_transform_with_state_state_variable.py    test_transform_with_state*.py)
The processors are this project's own (tests/helpers/tws_spark_time_processors.py), doing what
Spark's helper processors do, except that they report relations where Spark's put
processing times in their output.

To keep the file's run time low, each query combines several of Spark's tests, and most
run through one API only (the other API's run of the same scenario is another query);
which API and which Spark tests each covers is in its docstring. Spark's test conf runs
every query without no-data batches (so does this file: ProcessingTime queries need it,
as they always run another batch) and with the RocksDB state store.

A documented difference is kept out, not tested around: Spark's MapState.removeKey
with a TTL leaves the entry's TTL index row behind and counts it as removed again when
that TTL passes; arrowstate does not. The map states with a TTL here either never see
their TTL pass (test_ttl_tour) or are never removed from (test_ttl_expiry).

Spark's input: text files of "id, temperature" lines, one file per micro-batch.
Here: one Parquet file per micro-batch with the same columns and rows.
"""
import datetime as dt

import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F

import tws_spark_processors as tour_procs
import tws_spark_time_processors as procs
from harness import assert_same, run_query

cloudpickle.register_pickle_by_value(tour_procs)
cloudpickle.register_pickle_by_value(procs)

NODE = "ArrowTransformWithState"
VARS = ["numValueStateVars", "numListStateVars", "numMapStateVars", "numDeletedStateVars"]
TIMERS = ["numRegisteredTimers", "numDeletedTimers", "numExpiredTimers"]
TTL = ["numValueStateWithTTLVars", "numListStateWithTTLVars", "numMapStateWithTTLVars",
       "numValuesRemovedDueToTTLExpiry"]
READINGS = pa.schema([("id", pa.string()), ("temperature", pa.int32())])
THREE_COLUMNS = pa.schema([("id1", pa.string()), ("temperature", pa.int32()),
                           ("id2", pa.string())])
EVENTS = pa.schema([("id", pa.string()), ("eventTime", pa.timestamp("us", tz="UTC"))])


def readings(*pairs):
    return [{"id": str(i), "temperature": t} for i, t in pairs]


# Spark's _prepare_test_resource1, 2 and 3
RESOURCE1 = readings((0, 123), (0, 46), (1, 146), (1, 346))
RESOURCE2 = readings((0, 123), (0, 223), (0, 323), (1, 246), (1, 6))
RESOURCE3 = readings((0, 123), (1, 6))
# the second file of Spark's _test_transform_with_state_init_state
INIT_SECOND = readings((0, 67), (3, 12))
# Spark's initial state of the init-state tests, "id string, initVal int"
SEEDS = [("0", 789), ("3", 987)]


@pytest.fixture(autouse=True)
def spark_test_conf(spark_conf):
    """Spark's conf for these tests: the RocksDB state store (which native
    transformWithState needs) and no no-data batches."""
    spark_conf(**{"spark.sql.streaming.stateStore.providerClass":
                  "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
                  "spark.sql.streaming.noDataMicroBatches.enabled": "false",
                  # one state partition unless a test says otherwise: see the same setting
                  # in test_tws_spark_scenarios.py
                  "spark.sql.shuffle.partitions": 1})


def tws(processor, output, api, time_mode, by=("id",), initial=None, output_mode="Update",
        event_time_column=""):
    """The query's build: transformWithStateInPandas (api "pandas") or transformWithState
    (api "rows") of `processor`, grouped by the `by` columns."""
    def build(df):
        grouped = df.groupBy(*by)
        run = (grouped.transformWithStateInPandas if api == "pandas"
               else grouped.transformWithState)
        return run(statefulProcessor=processor, outputStructType=output,
                   outputMode=output_mode, timeMode=time_mode, initialState=initial,
                   eventTimeColumnName=event_time_column)
    return build


def as_set(rows, width=None):
    return {tuple(r[:width]) for r in rows}


def _at(*seconds, key="a"):
    return [{"id": key, "eventTime": dt.datetime.fromtimestamp(s, dt.timezone.utc)}
            for s in seconds]


# --------------------------------------------------------------------------------------------
# timers

def test_processing_time_timers(spark, spark_conf, tmp_path):
    """test_pandas_transform_with_state.py::test_transform_with_state_proc_timer, Row API
    (test_transform_with_state.py), with a single shuffle partition as
    ::test_transform_with_state_with_timers_single_partition runs it. Key 0 sets a
    processing-time timer in every batch, which fires in the next and resets its count.
    (The pandas API's processing-time timers: test_initial_state.)"""
    spark_conf(**{"spark.sql.shuffle.partitions": 1})
    native, ours = assert_same(
        spark, tmp_path, READINGS, [RESOURCE3, RESOURCE1, RESOURCE2],
        tws(procs.ProcessingTimeCount(False), procs.ProcessingTimeCount.OUTPUT, "rows",
            "ProcessingTime"),
        expect_node=NODE, output_mode="update", custom_metrics=TIMERS)
    assert ours.custom == native.custom
    # Spark's expectations, of (id, countAsString)
    assert as_set(native.outputs[0], 2) == {("0", "1"), ("1", "1")}
    assert as_set(native.outputs[1], 2) == {("0", "3"), ("0", "-1"), ("1", "3")}
    assert as_set(native.outputs[2], 2) == {("0", "3"), ("0", "-1"), ("1", "5")}
    # and what its processor asserts and its test checks of the times: the timer fired
    # before the batch's time, with two timers for the key (the one it had set in the
    # previous batch, and the batch's own), listed alike by two iterators
    fired = ("fired before the batch's time True, timers listed 2, listings agree True, "
             "this one listed True")
    for b in (1, 2):
        assert ("0", "-1", fired) in native.outputs[b]
        assert ("0", "3", "timers listed 2") in native.outputs[b]
    assert ("1", "1", "timers listed 0") in native.outputs[0]


def test_event_time_timers(spark, spark_conf, tmp_path):
    """test_pandas_transform_with_state.py::test_transform_with_state_event_time, pandas
    API, with a single shuffle partition as
    ::test_transform_with_state_with_timers_single_partition runs it: a watermark of
    10 seconds, a timer at the current watermark in every batch, which fires in the same
    batch and clears the key's largest event time; the third batch's event time 2 is late
    and dropped. (The Row API in EventTime mode: test_chaining_after_event_time.)"""
    spark_conf(**{"spark.sql.shuffle.partitions": 1})

    def build(df):
        return tws(procs.MaxEventTime(True), procs.MaxEventTime.OUTPUT, "pandas",
                   "EventTime")(df.withWatermark("eventTime", "10 seconds"))

    native, ours = assert_same(spark, tmp_path, EVENTS, [_at(20), _at(4), _at(2, 11, 13, 15)],
                               build, expect_node=NODE, output_mode="update",
                               custom_metrics=TIMERS)
    assert ours.custom == native.custom
    assert [as_set(native.outputs[b]) for b in (0, 1, 2)] == [
        {("a", "20"), ("a-expired", "0")},
        {("a", "4"), ("a-expired", "10000")},
        {("a", "15"), ("a-expired", "10000")}]
    assert [native.figures[b][0]["numRowsDroppedByWatermark"] for b in (0, 1, 2)] == [0, 0, 1]


def test_chaining_after_event_time(spark, spark_conf, tmp_path):
    """test_pandas_transform_with_state.py::test_transform_with_state_chaining_ops, Row API
    (test_transform_with_state.py), its run grouped by outputTimestamp and id: TWS in
    EventTime mode with outputTimestamp as its output's event-time column (watermark
    5 seconds), a count per outputTimestamp and id after it, in Append mode; the count
    for a time is emitted once the watermark passes it, and the third batch's row is late.
    (A single shuffle partition, for the file's run time.)"""
    spark_conf(**{"spark.sql.shuffle.partitions": 1})
    def build(df):
        out = tws(procs.FirstEventTime(False), procs.FirstEventTime.OUTPUT, "rows",
                  "EventTime", output_mode="Append", event_time_column="outputTimestamp")(
            df.withWatermark("eventTime", "5 seconds"))
        return out.groupBy("outputTimestamp", "id").count()

    batches = [_at(10) + _at(15, key="b"), _at(11) + _at(25, key="c"), _at(5)]
    native, _ = assert_same(spark, tmp_path, EVENTS, batches, build, expect_node=NODE,
                            output_mode="append")

    def counted(b):
        return {(r[0], r[2]) for r in native.outputs[b]}

    at = dt.datetime.fromtimestamp   # collect() gives local times, as Spark's test expects
    assert native.outputs[0] == []
    assert counted(1) == {(at(10), 1)}
    assert counted(2) == {(at(11), 1), (at(15), 1)}


# --------------------------------------------------------------------------------------------
# TTL

def test_ttl_tour(spark, spark_conf, tmp_path):
    """pandas API, in ProcessingTime mode:
    - test_pandas_transform_with_state_state_variable.py::test_value_state_ttl_basic
      (SimpleTTLStatefulProcessor: the violations count of test_transform_with_state_basic
      in a value state with a TTL, a deleted second variable);
    - ::test_transform_with_state_list_state_large_ttl (ListStateLargeTTLProcessor: the
      list state tour on lists with a TTL);
    - ::test_transform_with_state_map_state_large_ttl (MapStateLargeTTLProcessor: the map
      state tour on a map with a TTL, and a list never written);
    - ::test_transform_with_map_state_metadata_with_init_state, its query: the same with an
      initial state the processor does nothing with (Spark's default handleInitialState),
      through the initial-state runner. Its checks of the state metadata and state reader
      are dead code in Spark's test (they are under batch_id != 0 of a one-batch query);
      Spark's readers on arrowstate's checkpoints are test_state_readers.py's.
    TTLs that do not pass within the test (Spark's 30 s are an hour here), so all of it
    must behave as without a TTL (and the map tour's removeKey and clear on the map with
    a TTL stay clear of the documented removeKey difference, which needs the TTL to
    pass); two batches (Spark's single-batch tests run on the
    first). A single shuffle partition, for the file's run time. (Row API:
    test_ttl_expiry.)"""
    spark_conf(**{"spark.sql.shuffle.partitions": 1})
    initial = spark.createDataFrame(SEEDS, "id string, temperature int").groupBy("id")
    native, ours = assert_same(
        spark, tmp_path, READINGS, [RESOURCE1, RESOURCE2],
        tws(procs.TtlTour(True), procs.TtlTour.OUTPUT, "pandas", "ProcessingTime",
            initial=initial),
        expect_node=NODE, output_mode="update", custom_metrics=VARS + TTL)
    assert ours.custom == native.custom
    names = [c.split()[0] for c in procs.TtlTour.OUTPUT.split(", ")]
    first = {r[0]: dict(zip(names, r)) for r in native.outputs[0]}
    second = {r[0]: dict(zip(names, r)) for r in native.outputs[1]}
    assert set(first) == set(second) == {"0", "1"}   # key 3, only seeded, has no output
    raised = "exists() raised PySparkRuntimeError, Spark's message: True"
    reads = "120,120,20,20,120,20,111,222,111,120,120,120,20,20,20"
    tour = ("existed False; keys ['key1', 'key2']; values [{n}, {n}]; "
            "pairs [('key1', {n}), ('key2', {n})]; after removeKey(key1): contains False, "
            "exists True; after clear: exists False")
    for batch, counts, violations in ((first, ("2", "2"), (1, 2)),
                                      (second, ("3", "2"), (4, 3))):
        for key, count, violation in zip(("0", "1"), counts, violations):
            row = batch[key]
            # Spark's expectations: counts and violations as without a TTL
            assert (row["countAsString"], row["violations"]) == (count, violation)
            assert row["scratch"] == raised
            # what Spark's list and map processors assert
            assert row["listReads"] == reads and row["listLeft"] == "[0, 0, 0]"
            assert row["mapCount"] == count and row["mapTour"] == tour.format(n=count)
    assert [second[k]["previous"] for k in ("0", "1")] == [1, 2]
    for metrics in native.custom.values():
        assert all(metrics[0][f"num{kind}StateWithTTLVars"] > 0
                   for kind in ("Value", "List", "Map"))
        assert metrics[0]["numValuesRemovedDueToTTLExpiry"] == 0


def test_ttl_expiry(spark, tmp_path):
    """test_pandas_transform_with_state_state_variable.py::test_value_state_ttl_expiration
    (TTLStatefulProcessor; skipped in Spark as flaky, as it races a 10 s TTL against
    sleeps), Row API (test_transform_with_state_state_variable.py): Spark's three batches
    of one row per key; value, list and map states with a TTL count rows, key 0 leaves
    them unwritten in the second batch. Its timing made deterministic: the processor keeps
    them once with a TTL of 1 ms (passed by the next batch) and once with one of an hour
    (never passing); Spark's expected rows are those of the hour for what it expects kept
    and those of 1 ms for what it expects expired. The maps are only ever updated, never
    removed from, which keeps the documented removeKey difference out."""
    batch = readings((1, 0), (0, 0))
    native, ours = assert_same(
        spark, tmp_path, READINGS, [batch, batch, batch],
        tws(procs.TtlExpiry(False), procs.TtlExpiry.OUTPUT, "rows", "ProcessingTime"),
        expect_node=NODE, output_mode="update", custom_metrics=TTL)
    assert ours.custom == native.custom

    def rows(key, ttl, value, listed, mapped):
        return {(f"ttl-count-{key}", value, ttl), (f"ttl-list-state-count-{key}", listed, ttl),
                (f"ttl-map-state-count-{key}", mapped, ttl)}

    def expected(b, kept):
        out = set()
        for key in ("0", "1"):
            out |= {(f"count-{key}", b + 1, None)} | rows(key, "1 ms", 1, 1, 1)
            out |= rows(key, "1 hour", *(kept[key] if b else (1, 1, 1)))
        return out

    hour = [None, {"0": (2, 3, 2), "1": (2, 3, 2)}, {"0": (2, 3, 2), "1": (3, 7, 3)}]
    for b in (0, 1, 2):
        assert as_set(native.outputs[b]) == expected(b, hour[b])

    # Spark's expectations: kept state from the hour's rows; at the third batch key 0's,
    # unwritten since the first, has expired: the 1 ms rows
    spark_expected = [
        {("ttl-count-0", 1), ("count-0", 1), ("ttl-list-state-count-0", 1),
         ("ttl-map-state-count-0", 1), ("ttl-count-1", 1), ("count-1", 1),
         ("ttl-list-state-count-1", 1), ("ttl-map-state-count-1", 1)},
        {("ttl-count-0", 2), ("count-0", 2), ("ttl-list-state-count-0", 3),
         ("ttl-map-state-count-0", 2), ("ttl-count-1", 2), ("count-1", 2),
         ("ttl-list-state-count-1", 3), ("ttl-map-state-count-1", 2)},
        {("ttl-count-0", 1), ("count-0", 3), ("ttl-list-state-count-0", 1),
         ("ttl-map-state-count-0", 1), ("ttl-count-1", 3), ("count-1", 3),
         ("ttl-list-state-count-1", 7), ("ttl-map-state-count-1", 3)}]
    for b in (0, 1, 2):
        picked = {(r[0], r[1]) for r in native.outputs[b]
                  if r[2] is None or r[2] == ("1 ms" if b == 2 and r[0].endswith("-0")
                                              else "1 hour")}
        assert picked == spark_expected[b]


# --------------------------------------------------------------------------------------------
# initial state

def test_initial_state(spark, spark_conf, tmp_path):
    """pandas API, in ProcessingTime mode, a single shuffle partition:
    - test_pandas_transform_with_state_state_variable.py::test_transform_with_state_init_state
      (SimpleStatefulProcessorWithInitialState: the initial state seeds a running sum; key
      0 is seeded and in the first batch, key 3 seeded and first seen in the second);
    - ::test_transform_with_state_init_state_with_extra_transformation (a projection of
      the output to key and to_json(value));
    - ::test_transform_with_state_init_state_with_timers, with a single partition as
      ::test_transform_with_state_with_timers_single_partition runs it
      (StatefulProcessorWithInitialStateTimers: handleInitialState sets a processing-time
      timer 1 ms before the batch's time, which fires in the first batch, for key 3 too);
    - test_pandas_transform_with_state.py::test_transform_with_state_with_records_limit,
      its case with an initial state (ChunkCountProcessorWithInitialState) and
      maxRecordsPerBatch 1: each row its own DataFrame.
    Spark's init-state tests have two batches (and run in time mode None, but for the one
    with timers); a third, Spark's resource 2 as in its records-limit test, adds that
    test's second batch. (Row API: test_non_contiguous_grouping_with_initial_state, which
    also compares the columns handleInitialState is handed.)"""
    spark_conf(**{"spark.sql.shuffle.partitions": 1,
                  "spark.sql.execution.arrow.maxRecordsPerBatch": 1})
    initial = spark.createDataFrame(SEEDS, "id string, initVal int").groupBy("id")

    def build(df):
        out = tws(procs.SeededSum(True, timers=True), procs.SeededSum.output(), "pandas",
                  "ProcessingTime", initial=initial)(df)
        return out.select(F.col("id").cast("string").alias("key"),
                          F.to_json(F.struct(F.col("value"))).alias("value"), "chunks")

    native, ours = assert_same(spark, tmp_path, READINGS, [RESOURCE1, INIT_SECOND, RESOURCE2],
                               build, expect_node=NODE, output_mode="update",
                               custom_metrics=TIMERS)
    assert ours.custom == native.custom

    def value(n):
        return f'{{"value":"{n}"}}'

    fired = value("fired before the batch's time True")
    data = [{r for r in native.outputs[b] if "expired" not in r[0]} for b in (0, 1, 2)]
    # Spark's expectations: sums, the timers fired for keys 0 and 3 in the first batch
    # only, and the rows per DataFrame
    assert data[0] == {("0", value(789 + 123 + 46), 2), ("1", value(146 + 346), 2)}
    assert {r for r in native.outputs[0] if "expired" in r[0]} == {
        ("0-expired", fired, None), ("3-expired", fired, None)}
    assert data[1] == {("0", value(789 + 123 + 46 + 67), 1), ("3", value(987 + 12), 1)}
    assert data[2] == {("0", value(789 + 123 + 46 + 67 + 669), 3),
                       ("1", value(146 + 346 + 252), 2)}
    assert all("expired" not in r[0] for b in (1, 2) for r in native.outputs[b])


def test_batch_query_with_initial_state(spark, spark_conf):
    """test_pandas_transform_with_state.py::test_transform_with_state_batch_query_initial_state
    (SimpleStatefulProcessorWithInitialState over a batch DataFrame; Row API twin in
    test_transform_with_state.py), with maxRecordsPerBatch -1 (no limit), the large-limit
    case of test_transform_with_state_with_records_limit with an initial state: batch
    queries, with arrowstate on and off (arrowstate leaves batch queries to Spark)."""
    spark_conf(**{"spark.sql.execution.arrow.maxRecordsPerBatch": -1})
    df = spark.createDataFrame([(r["id"], r["temperature"]) for r in RESOURCE1],
                               "id string, temperature int")
    initial = spark.createDataFrame(SEEDS, "id string, initVal int").groupBy("id")
    results = {}
    for enabled in ("false", "true"):
        spark_conf(**{"spark.arrowstate.enabled": enabled})
        for api in ("pandas", "rows"):
            out = tws(procs.SeededSum(api == "pandas"), procs.SeededSum.output(), api,
                      "None", initial=initial)(df)
            results[enabled, api] = sorted(tuple(r) for r in out.collect())
    for api in ("pandas", "rows"):
        assert [r[:2] for r in results["false", api]] == [("0", str(789 + 123 + 46)),
                                                          ("1", str(146 + 346))]
        assert results["true", api] == results["false", api]
    assert [r[2] for r in results["false", "pandas"]] == [1, 1]   # one DataFrame per key


def _list_state(spark, checkpoint, name, column):
    """A list state variable's elements per key, sorted, read with Spark's state reader."""
    read = (spark.read.format("statestore").option("path", checkpoint)
            .option("stateVarName", name).load()
            .selectExpr("key.id AS id", f"list_element.{column} AS v").collect())
    out = {}
    for key, v in read:
        out.setdefault(key, []).append(v)
    return {k: sorted(v) for k, v in out.items()}


def test_restart_with_multiple_rows_of_initial_state(spark, spark_conf, tmp_path):
    """test_pandas_transform_with_state_state_variable.py::
    test_transform_with_state_restart_with_multiple_rows_init_state, pandas API, with a
    single shuffle partition as ::test_transform_with_state_with_timers_single_partition
    runs it: a first query keeps lists (ListStateProcessor: listState1 ends
    [120, 20, 111, 120, 20] per key), Spark's state reader reads them from its checkpoint,
    and they are a second query's initial state, five rows per key, which
    handleInitialState appends to a list state (StatefulProcessorWithListStateInitialState);
    Spark's reader reads that list from the second query's checkpoint. Spark's state
    readers do not read arrowstate's transformWithState state yet (it fails naming the
    limitation), so the first query runs on Spark only (its scenario runs differentially
    in test_tws_spark_scenarios.py::test_state_variable_tour), the second runs
    differentially, and the list it ends with is read from Spark's run's checkpoint
    (arrowstate's run shows it in its output, which must be the same).

    Not in Spark's test: spark.sql.execution.arrow.maxRecordsPerBatch 2 (Spark's test conf
    sets 2 for the state server's list fetches), under which pyspark's worker hands each
    key's five initial-state rows to handleInitialState as DataFrames of 2, 2 and 1 rows
    (and the input, 2 rows per key, as one); the output tells those sizes, which
    arrowstate must match."""
    spark_conf(**{"spark.sql.shuffle.partitions": 1,
                  "spark.sql.execution.arrow.maxRecordsPerBatch": 2})
    first = run_query(spark, str(tmp_path / "first"), READINGS, [RESOURCE1],
                      tws(tour_procs.StateVariableTour(["list"], True),
                          tour_procs.tour_output(["list"]), "pandas", "None"),
                      arrowstate=False, output_mode="update")
    lists = [20, 20, 111, 120, 120]
    assert _list_state(spark, first.checkpoint, "listState1", "temperature") == {
        "0": lists, "1": lists}
    initial = (spark.read.format("statestore").option("path", first.checkpoint)
               .option("stateVarName", "listState1").load()
               .selectExpr("key.id AS id", "list_element.temperature AS initVal")
               .groupBy("id"))
    native, _ = assert_same(
        spark, tmp_path, READINGS, [RESOURCE1, INIT_SECOND],
        tws(procs.SeededList(True), procs.SeededList.OUTPUT, "pandas", "None",
            initial=initial),
        expect_node=NODE, output_mode="update")
    listed = ",".join(map(str, lists))
    # Spark's expectations, of (id, value); and the list as handleInputRows reads it
    assert as_set(native.outputs[0], 3) == {("0", str(123 + 46), listed),
                                            ("1", str(146 + 346), listed)}
    assert as_set(native.outputs[1], 3) == {("0", str(123 + 46 + 67), listed),
                                            ("3", "12", "")}
    assert _list_state(spark, native.checkpoint, "list_state", "value") == {
        "0": lists, "1": lists}
    # the DataFrames pyspark's worker made
    assert {r[0]: r[3:] for r in native.outputs[0]} == {"0": ("2", "2,2,1"),
                                                        "1": ("2", "2,2,1")}


def test_non_contiguous_grouping_with_initial_state(spark, tmp_path):
    """test_pandas_transform_with_state.py::
    test_transform_with_state_non_contiguous_grouping_cols_with_init_state, Row API
    (test_transform_with_state.py), time mode None: input and initial state grouped by
    id1 and id2, which are not their first columns. Spark's test has one batch; a second
    one brings key (3, 2), seeded but not in the first (as in
    test_transform_with_state_init_state).

    The output's initColumns column (not in Spark's test) is the fields of the Row
    handleInitialState was handed for the key: Spark hands the initial state's own
    columns, initVal, id1, id2 (the columns after the grouping columns that groupBy puts
    first), so that positional access and __fields__ see those; arrowstate must hand the
    same."""
    batches = [[{"id1": i1, "temperature": t, "id2": i2}
                for i1, t, i2 in [("0", 123, "1"), ("0", 46, "1"), ("1", 146, "2"),
                                  ("1", 346, "2")]],
               [{"id1": "0", "temperature": 67, "id2": "1"},
                {"id1": "3", "temperature": 12, "id2": "2"}]]
    initial = spark.createDataFrame([(789, "0", "1"), (987, "3", "2")],
                                    "initVal int, id1 string, id2 string").groupBy("id1", "id2")
    native, _ = assert_same(
        spark, tmp_path, THREE_COLUMNS, batches,
        tws(procs.SeededSum(False), procs.SeededSum.output(("id1", "id2")), "rows", "None",
            by=("id1", "id2"), initial=initial),
        expect_node=NODE, output_mode="update")
    assert as_set(native.outputs[0], 3) == {("0", "1", str(789 + 123 + 46)),
                                            ("1", "2", str(146 + 346))}
    assert as_set(native.outputs[1], 3) == {("0", "1", str(789 + 123 + 46 + 67)),
                                            ("3", "2", str(987 + 12))}
    seeded = {r[:2]: r[4] for r in native.outputs[0]}
    assert seeded == {("0", "1"): "initVal,id1,id2", ("1", "2"): None}
