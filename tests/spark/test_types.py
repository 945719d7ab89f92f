"""The type matrix: every Spark SQL type as a deduplication key and as an aggregation
buffer (first()), against native Spark. A type arrowstate cannot carry must fall back with
its reason, never fail at run time."""
import datetime as dt
import decimal

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from harness import assert_same

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


def _batches(arrow_type, values):
    rows = [{"g": i % 2, "k": v, "n": i} for i, v in enumerate(values)]
    return pa.schema([("g", pa.int64()), ("k", arrow_type), ("n", pa.int64())]), [
        rows[:2], rows[2:], rows]


def _ran_or_fell_back(runs, node):
    for plan in runs.plans:
        assert node in plan or "ArrowStateFallback [reason:" in plan, plan


@pytest.mark.parametrize("name", [t for t in TYPES if not t.startswith("map")])
def test_deduplication_key_types(spark, tmp_path, name):
    schema, batches = _batches(*TYPES[name])
    _, ours = assert_same(spark, tmp_path, schema, batches,
                          lambda df: df.dropDuplicates(["k"]), expect_node=None)
    _ran_or_fell_back(ours, "ArrowStreamingDeduplicate")


@pytest.mark.parametrize("name", list(TYPES))
def test_aggregation_buffer_types(spark, tmp_path, name):
    schema, batches = _batches(*TYPES[name])
    _, ours = assert_same(
        spark, tmp_path, schema, batches,
        lambda df: df.groupBy("g").agg(F.first("k", ignorenulls=True).alias("first"),
                                       F.count("k").alias("n")),
        expect_node=None, output_mode="update")
    _ran_or_fell_back(ours, "ArrowStateStoreSave")
