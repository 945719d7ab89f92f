"""The type matrix: every Spark SQL type as a deduplication key, as an aggregation buffer
(first()) and as a field of applyInPandasWithState state and output, against native Spark.
A type arrowstate cannot carry must fall back with its reason, never fail at run time."""
import datetime as dt
import decimal
import functools

import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout

import fmgws_functions as fns
from harness import assert_same, run_query

cloudpickle.register_pickle_by_value(fns)

UTC = dt.timezone.utc
TYPES = {
    "boolean": (pa.bool_(), [True, False, True, None]),
    "tinyint": (pa.int8(), [1, -128, 1, None, 127]),
    "smallint": (pa.int16(), [1, -32768, 1, None]),
    "int": (pa.int32(), [7, 0, 7, None, -1]),
    "bigint": (pa.int64(), [2**62, 0, 2**62, None]),
    "float": (pa.float32(), [1.5, -0.0, 0.0, float("nan"), float("nan"), None]),
    "double": (pa.float64(), [1e300, -0.0, 0.0, float("nan"), None, 1e300]),
    "decimal(38,10)": (pa.decimal128(38, 10),
                       [decimal.Decimal("1234567890123456789012345678.0123456789"),
                        decimal.Decimal("0E-10"), None,
                        decimal.Decimal("1234567890123456789012345678.0123456789")]),
    "string": (pa.string(), ["a", "", "é€", "a", None]),
    "binary": (pa.binary(), [b"\x00", b"", b"\xff\xfe", b"\x00", None]),
    "date": (pa.date32(), [dt.date(2024, 2, 29), dt.date(1, 1, 1), None, dt.date(2024, 2, 29)]),
    "timestamp": (pa.timestamp("us", tz="UTC"),
                  [dt.datetime(2024, 1, 1, 12, tzinfo=UTC), None,
                   dt.datetime(1900, 1, 1, tzinfo=UTC), dt.datetime(2024, 1, 1, 12, tzinfo=UTC)]),
    "timestamp_ntz": (pa.timestamp("us"), [dt.datetime(2024, 1, 1, 12), None,
                                           dt.datetime(2024, 1, 1, 12)]),
    "array<int>": (pa.list_(pa.int32()), [[1, 2], [], None, [1, 2], [None]]),
    "struct": (pa.struct([("a", pa.int32()), ("b", pa.string())]),
               [{"a": 1, "b": "x"}, None, {"a": None, "b": None}, {"a": 1, "b": "x"}]),
    "array<struct>": (pa.list_(pa.struct([("a", pa.int64())])),
                      [[{"a": 1}], [{"a": None}], None, [{"a": 1}]]),
    "map<string,int>": (pa.map_(pa.string(), pa.int32()), [[("k", 1)], [], None, [("k", 1)]]),
}

DDL = {"struct": "struct<a:int,b:string>", "array<struct>": "array<struct<a:bigint>>"}


def _batches(arrow_type, values):
    rows = [{"g": i % 2, "k": v, "n": i} for i, v in enumerate(values)]
    return pa.schema([("g", pa.int64()), ("k", arrow_type), ("n", pa.int64())]), [
        rows[:2], rows[2:], rows]


def _ran_or_fell_back(runs, node):
    for plan in runs.plans:
        assert node in plan or "ArrowStateFallback [reason:" in plan, plan


def test_deduplication_key_types(spark, tmp_path):
    """Every type as a deduplication key, in one query: one dropDuplicates per type, each on
    its own column of the same input, their rows tagged with the type and united."""
    names = [t for t in TYPES if not t.startswith("map")]
    schema, batches = _wide_batches(names)

    def every_key_type(df):
        branches = [df.dropDuplicates([f"k{i}"])
                    .select(F.lit(name).alias("type"), F.to_json(F.struct(f"k{i}")).alias("k"))
                    for i, name in enumerate(names)]
        return functools.reduce(lambda a, b: a.union(b), branches)

    _, ours = assert_same(spark, tmp_path, schema, batches, every_key_type, expect_node=None)
    assert {r[0] for rows in ours.outputs.values() for r in rows} == set(names)
    for plan in ours.plans:
        ran = plan.count("ArrowStreamingDeduplicate ")
        assert ran + plan.count("ArrowStateFallback [reason:") >= len(names), plan


def _wide_batches(names):
    """One column k0, k1, ... per type (its values in turn), beside g and n: every type in
    one query."""
    length = max(len(TYPES[name][1]) for name in names)
    schema = pa.schema([("g", pa.int64())] + [(f"k{i}", TYPES[name][0])
                                              for i, name in enumerate(names)]
                       + [("n", pa.int64())])
    rows = [{"g": r % 2, "n": r, **{f"k{i}": TYPES[name][1][r % len(TYPES[name][1])]
                                    for i, name in enumerate(names)}}
            for r in range(length)]
    return schema, [rows[:2], rows[2:], rows]


def test_aggregation_buffer_types(spark, tmp_path):
    """Every type as an aggregation buffer (first() keeps a value of it), in one query."""
    names = list(TYPES)
    schema, batches = _wide_batches(names)
    aggs = [agg for i in range(len(names))
            for agg in (F.first(f"k{i}", ignorenulls=True).alias(f"first{i}"),
                        F.count(f"k{i}").alias(f"n{i}"))]
    assert_same(spark, tmp_path, schema, batches, lambda df: df.groupBy("g").agg(*aggs),
                expect_node="ArrowStateStoreSave", output_mode="update")


def _keeps_last_value(ddl):
    return lambda df: df.groupBy("g").applyInPandasWithState(
        fns.keeps_last_value, f"g long, last {ddl}, seen string, n long", f"last {ddl}, n long",
        "Update", GroupStateTimeout.NoTimeout)


# Spark 4.3 cannot run applyInPandasWithState with an array or a map in its state: the
# worker fails to parse the state schema the JVM sends (KeyError 'elementType'/'keyType'
# in pyspark's worker). arrowstate holds them; the expected rows are written out here.
NATIVE_CANNOT = {
    "array<int>": ("elementType", {
        0: [(0, None, None, 1), (1, None, None, 1)],
        1: [(0, [1, 2], "list: [1, 2]", 3), (1, [], "list: []", 2)],
        2: [(0, [None], "list: [None]", 6), (1, [1, 2], "list: [1, 2]", 4)]}),
    "array<struct>": ("elementType", {
        0: [(0, None, None, 1), (1, None, None, 1)],
        1: [(0, [(1,)], "list: [Row(a=1)]", 2), (1, [(None,)], "list: [Row(a=None)]", 2)],
        2: [(0, None, "NoneType: None", 4), (1, [(1,)], "list: [Row(a=1)]", 4)]}),
    "map<string,int>": ("keyType", {
        0: [(0, None, None, 1), (1, None, None, 1)],
        1: [(0, {"k": 1}, "dict: {'k': 1}", 2), (1, {}, "dict: {}", 2)],
        2: [(0, None, "NoneType: None", 4), (1, {"k": 1}, "dict: {'k': 1}", 4)]}),
}


def test_apply_in_pandas_with_state_field_types(spark, tmp_path):
    """Every type as a state field and an output column, in one query; the function reports
    each stored value's Python type and repr, so a value that comes back in another form
    shows."""
    names = [t for t in TYPES if t not in NATIVE_CANNOT]
    schema, batches = _wide_batches(names)
    ddls = [DDL.get(name, name) for name in names]
    output = ", ".join(["g long"] + [f"last{i} {d}, seen{i} string" for i, d in enumerate(ddls)]
                       + ["n long"])
    state = ", ".join([f"last{i} {d}" for i, d in enumerate(ddls)] + ["n long"])
    assert_same(spark, tmp_path, schema, batches,
                lambda df: df.groupBy("g").applyInPandasWithState(
                    fns.keeps_last_values, output, state, "Update", GroupStateTimeout.NoTimeout),
                expect_node="ArrowFlatMapGroupsWithState", output_mode="update",
                restart_after=[1])


@pytest.mark.parametrize("name", list(NATIVE_CANNOT))
def test_apply_in_pandas_with_state_holds_what_spark_cannot(spark, tmp_path, name):
    schema, batches = _batches(*TYPES[name])
    missing, expected = NATIVE_CANNOT[name]
    build = _keeps_last_value(DDL.get(name, name))
    with pytest.raises(StreamingQueryException, match=f"KeyError: '{missing}'"):
        run_query(spark, str(tmp_path), schema, batches, build, arrowstate=False,
                  output_mode="update")
    ours = run_query(spark, str(tmp_path), schema, batches, build, arrowstate=True,
                     output_mode="update", restart_after=[1])
    assert ours.outputs == expected
    assert all("ArrowFlatMapGroupsWithState" in plan for plan in ours.plans)


def test_state_update_coerces_values_as_spark_does(spark, tmp_path):
    """Values of other Python types than a state field's (ints for doubles, numpy scalars,
    pandas timestamps, tuples for arrays, out-of-range ints...) are stored as Spark stores
    them: converted, wrapped, rounded, or null."""
    schema = pa.schema([("g", pa.int64()), ("n", pa.int64())])
    batches = [[{"g": g, "n": i} for g in (0, 1)] for i in range(len(fns.COERCIONS) + 1)]
    assert_same(spark, tmp_path, schema, batches,
                lambda df: df.groupBy("g").applyInPandasWithState(
                    fns.stores_coerced_values, "g long, seen string", fns.COERCED_STATE,
                    "Update", GroupStateTimeout.NoTimeout),
                expect_node="ArrowFlatMapGroupsWithState", output_mode="update",
                restart_after=[1])
