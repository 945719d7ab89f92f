"""transformWithState's Row API conversions: each fast path gives what pyspark's worker's
own conversion gives (Arrow's as_py per cell, Row(*names)(*values), asDict(True) then
from_pylist)."""
import datetime
import decimal
import pickle

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import Row

from arrowstate.families.transform_with_state.processor_input import (
    INITIAL, INPUT, ProcessorInput, key_bounds, python_column, row_class)
from arrowstate.families.transform_with_state.processor_output import rows_to_arrow

MICROS = [1_700_000_000_123_456, None, 0, -1, -62135000000000000, 253402000000000000,
          1_710_054_000_000_000,   # 2024-03-10 07:00 UTC: New York's clocks go forward
          1_699_165_800_000_000]   # 2023-11-05 06:30 UTC: 01:30 in New York a second time


ZONES = ["UTC", "Etc/UTC", "+00:00", "America/New_York", "Asia/Kolkata", "-03:30", "+05:45",
         "Etc/GMT+5", "Etc/GMT-14", "GMT", "Zulu", None]
# random instants over datetime's whole range and within a day of the epoch
RANDOM = np.random.default_rng(5)
MANY = (RANDOM.integers(-62135596800000000 + 2 * 86_400_000_000,
                        253402300799999999 - 2 * 86_400_000_000, 20_000).tolist()
        + RANDOM.integers(-86_400_000_000, 86_400_000_000, 5_000).tolist())


@pytest.mark.parametrize("zone", ZONES)
@pytest.mark.parametrize("micros", [MICROS, MANY], ids=["edges", "random"])
def test_timestamps_as_arrow_makes_them(zone, micros):
    array = pa.array(micros, pa.timestamp("us", tz=zone))
    fast, arrow = python_column(array), array.to_pylist()
    assert fast == arrow
    assert [None if v is None else (v.tzinfo, v.utcoffset(), v.fold, v.replace(tzinfo=None))
            for v in fast] == \
        [None if v is None else (v.tzinfo, v.utcoffset(), v.fold, v.replace(tzinfo=None))
         for v in arrow]
    # where Arrow gives every value one zone object (not for a fixed offset other than
    # UTC: a new one each), that very object, as a processor comparing zones by identity
    if len({id(a.tzinfo) for a in arrow if a is not None}) == 1:
        assert all(v is None or v.tzinfo is a.tzinfo for v, a in zip(fast, arrow))


@pytest.mark.parametrize("micros,zone", [(-62135596800000001, "UTC"),
                                         (-62135596800000000, "America/New_York"),
                                         (-62135596800000000, "Etc/GMT+5"),
                                         (253402300799999999, "+05:00")])
def test_timestamps_past_datetime_fail_as_arrow_fails(micros, zone):
    array = pa.array([micros], pa.timestamp("us", tz=zone))
    with pytest.raises(Exception) as arrow:
        array.to_pylist()
    with pytest.raises(arrow.type, match=str(arrow.value)):
        python_column(array)


def test_other_columns_and_slices():
    for array in (pa.array([1, None, 3]), pa.array(["a", None]), pa.array([1.5, float("nan")]),
                  pa.array(MICROS, pa.timestamp("us", tz="UTC")).slice(2, 3),
                  pa.array([], pa.timestamp("us", tz="UTC"))):
        assert repr(python_column(array)) == repr(array.to_pylist())   # nan: by repr


def test_rows_behave_as_pyspark_rows():
    names = ["key", "ts", "value"]
    values = (1, datetime.datetime(2024, 1, 1), 0.5)
    fast, native = tuple.__new__(row_class(names, Row), values), Row(*names)(*values)
    assert fast == native and isinstance(fast, Row)
    assert (fast.key, fast["ts"], fast.value) == (native.key, native["ts"], native.value)
    assert fast.asDict() == native.asDict() and repr(fast) == repr(native)
    assert "key" in fast and "other" not in fast
    assert pickle.loads(pickle.dumps(fast)).asDict() == native.asDict()
    with pytest.raises(AttributeError):
        fast.missing
    # one class per fields, made once (a real-time flush is a batch)
    assert row_class(names, Row) is type(fast) and row_class(names[:2], Row) is not type(fast)


def test_output_rows_by_column_and_by_name():
    schema = pa.schema([("key", pa.int64()), ("count", pa.int64())])
    in_order = [Row(key=1, count=2), Row(key=3, count=None)]
    swapped = [Row(key=1, count=2), Row(count=4, key=3)]
    for rows in (in_order, swapped):
        expected = pa.RecordBatch.from_pylist([r.asDict(True) for r in rows], schema=schema)
        assert rows_to_arrow(rows, schema).equals(expected)
    nested = pa.schema([("key", pa.int64()), ("inner", pa.struct([("a", pa.int64()),
                                                                  ("b", pa.string())]))])
    rows = [Row(key=1, inner=Row(b="x", a=2))]   # by name within the struct too
    assert rows_to_arrow(rows, nested).to_pylist() == [{"key": 1, "inner": {"a": 2, "b": "x"}}]
    typed = pa.schema([("t", pa.timestamp("us", tz="UTC")), ("d", pa.date32()),
                       ("b", pa.binary()), ("x", pa.decimal128(10, 2)), ("s", pa.string())])
    rows = [Row(t=datetime.datetime(2024, 1, 1, 5), d=datetime.date(2024, 1, 2), b=b"ab",
                x=decimal.Decimal("1.25"), s="v"), Row(t=None, d=None, b=None, x=None, s=None)]
    expected = pa.RecordBatch.from_pylist([r.asDict(True) for r in rows], schema=typed)
    assert rows_to_arrow(rows, typed).equals(expected)
    assert rows_to_arrow(rows, typed).schema == typed
    with pytest.raises(AttributeError):   # as pyspark's worker fails on a plain tuple
        rows_to_arrow([(1, 2)], schema)
    with pytest.raises(pa.ArrowInvalid):
        rows_to_arrow([Row(key="a", count=1)], schema)


def test_key_bounds():
    keys = np.array([1, 1, 2, 5, 5, 5, 7])
    batch = pa.record_batch([pa.array(keys)], names=["k"])
    groups = keys.tolist()
    assert key_bounds(batch, groups) == [0, 2, 3, 6, 7]
    strings = pa.record_batch([pa.array(["a", "a", "b"])], names=["k"])
    assert key_bounds(strings, ["a", "a", "b"]) == [0, 2, 3]
    with_null = pa.record_batch([pa.array([None, None, 1])], names=["k"])
    assert key_bounds(with_null, [None, None, 1]) == [0, 2, 3]


def test_each_key_comes_whole_once_its_rows_have_all_come_per_stream():
    """A batch's last key waits: its rows may go on in the stream's next batch (a key may
    span three batches, or be all of one); the next key or `rest` hands it over. The input
    and the initial state wait apart."""
    cut = ProcessorInput({"pandas": False, "maxRecordsPerBatch": 10}, None, Row)

    def batch(keys, values):
        return pa.record_batch([pa.array(keys), pa.array(values)], names=["k", "v"])

    def whole(batch_, stream=INPUT):
        return [(key, [row.v for row in items]) for _, _, key, items in
                cut.whole_keys(batch_, [0], [1], None, stream)]

    assert whole(batch(["a", "a", "b"], [1, 2, 3])) == [(("a",), [1, 2])]
    assert whole(batch(["x"], [9]), INITIAL) == []
    assert whole(batch(["b"], [4])) == []
    assert whole(batch(["b", "c", "d"], [5, 6, 7])) == [(("b",), [3, 4, 5]), (("c",), [6])]
    assert whole(batch(["e"], [8])) == [(("d",), [7])]
    assert whole(batch([], [])) == []
    group, (key_batch, row), key, items = cut.rest()
    assert (group, key_batch.column(0)[row].as_py(), key) == (b"e", "e", ("e",))
    assert cut.rest() is None
    assert [(k, [r.v for r in items]) for _, _, k, items in [cut.rest(INITIAL)]] == [
        (("x",), [9])]


def test_a_keys_rows_are_the_frames_rows_indexed_from_zero_for_every_dtype(monkeypatch):
    import warnings

    import pandas as pd

    from arrowstate.families.pandas_io import PandasIO

    io = PandasIO({"runnerConf": {}, "outputSchema": '{"type":"struct","fields":[]}'})
    n = 7
    frame = pd.concat([
        pd.Series(np.arange(n), name="long"), pd.Series(np.arange(n) / 2, name="double"),
        pd.Series([f"s{i}" for i in range(n)], name="string"),
        pd.Series(pd.array([1, None, 3, 4, None, 6, 7], dtype="Int64"), name="nullable"),
        pd.Series(pd.date_range("2026-01-01", periods=n, freq="h", tz="Europe/Berlin"),
                  name="ts"),
        pd.Series(pd.Categorical(list("abcabca")), name="category"),
        pd.Series([{"x": i} for i in range(n)], name="struct"),
        pd.Series(np.arange(n), name="long")], axis=1)   # a repeated name, as a frame may have
    for lo, hi in [(0, n), (2, 5), (6, 7), (3, 3)]:
        rows = io.frame_rows(frame, lo, hi)
        expected = frame.iloc[lo:hi].reset_index(drop=True)
        pd.testing.assert_frame_equal(rows, expected)
        assert isinstance(rows.index, pd.RangeIndex) and rows.index.start == 0
        with warnings.catch_warnings():   # pyspark's frames are their own: no copy warning
            warnings.simplefilter("error")
            rows["added"] = 1
        assert "added" not in frame.columns
    # a pandas without the internals used takes the general path, to the same rows
    from arrowstate.families import pandas_io

    def other_internals(*_):
        raise AttributeError("_mgr")
    monkeypatch.setattr(pandas_io, "_rows_from_blocks", other_internals)
    for lo, hi in [(0, n), (2, 5), (3, 3)]:
        rows = io.frame_rows(frame, lo, hi)
        pd.testing.assert_frame_equal(rows, frame.iloc[lo:hi].reset_index(drop=True))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            rows["added"] = 1


OUTPUT_FIELDS = [("key", "string"), ("n", "long"), ("x", "double"), ("small", "integer"),
                 ("flag", "boolean"), ("raw", "binary")]


def _output_io(fields, **conf):
    import json

    from arrowstate.families.pandas_io import PandasIO
    schema = {"type": "struct", "fields": [
        {"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields]}
    return PandasIO({"runnerConf": {"spark.sql.session.timeZone": "UTC", **conf},
                     "outputSchema": json.dumps(schema)})


def _pyspark_output(io, frames):
    """What pyspark's worker makes of the frames: their concatenation, converted."""
    import pandas as pd
    from pyspark.sql.conversion import PandasToArrowConversion
    return PandasToArrowConversion.convert(
        pd.concat(frames, ignore_index=True), io.output_schema, timezone="UTC",
        safecheck=io.safecheck, arrow_cast=True, assign_cols_by_name=io.assign_cols_by_name,
        int_to_decimal_coercion_enabled=False)


def _frame(rows=3, **columns):
    import pandas as pd
    base = {"key": [f"k{i}" for i in range(rows)], "n": np.arange(rows),
            "x": np.arange(rows) / 2, "small": np.arange(rows, dtype=np.int32),
            "flag": np.arange(rows) % 2 == 0, "raw": [bytes([i]) for i in range(rows)]}
    return pd.DataFrame({**base, **columns})


@pytest.mark.parametrize("case", [
    "plain", "reordered", "by_position", "nulls", "float_into_long", "nan_into_long",
    "overflow", "overflow_safe", "not_a_string", "many_frames", "other_columns"])
def test_output_frames_convert_as_pyspark_converts_them(case):
    """The output's fast path (numpy values straight to Arrow) against pyspark's conversion
    of the same frames: the same batch, or the same error."""
    conf = {"spark.sql.execution.pandas.convertToArrowArraySafely": "true"} \
        if case == "overflow_safe" else {}
    if case == "by_position":
        conf["spark.sql.legacy.execution.pandas.groupedMap.assignColumnsByName"] = "false"
    io = _output_io(OUTPUT_FIELDS, **conf)
    frames = {
        "plain": [_frame()],
        "reordered": [_frame()[["n", "raw", "key", "flag", "small", "x"]]],
        "by_position": [_frame().set_axis(list("abcdef"), axis=1)],
        "nulls": [_frame(key=["a", None, float("nan")], x=[1.0, float("nan"), None],
                         raw=[b"", None, b"z"])],
        "float_into_long": [_frame(n=[1.0, 2.0, 3.5])],
        "nan_into_long": [_frame(n=[1.0, float("nan"), 3.0])],
        "overflow": [_frame(small=np.array([1, 2**40, -3]))],
        "overflow_safe": [_frame(small=np.array([1, 2**40, -3]))],
        "not_a_string": [_frame(key=["a", 2, "c"])],
        "many_frames": [_frame(), _frame(1), _frame(5)],
        "other_columns": [_frame(), _frame()[["key", "n", "x", "small", "flag"]]
                          .assign(extra=1, raw=b"r")],
    }[case]
    try:
        expected = _pyspark_output(io, frames)
    except Exception as e:   # noqa: BLE001 - the same error is what is compared
        io.outputs = list(frames)
        with pytest.raises(type(e)) as got:
            io.output_batch()
        assert str(got.value) == str(e)
        return
    if case in ("plain", "reordered", "by_position", "nulls", "many_frames"):
        def not_taken(*_, **__):
            raise AssertionError("pyspark's conversion, where the fast path was to go")
        io._to_arrow = not_taken
    io.outputs = list(frames)
    got = io.output_batch()
    assert got.schema == expected.schema and got.equals(expected), (got, expected)
    assert io.outputs == []


def test_output_of_a_nested_schema_takes_pysparks_conversion():
    import pandas as pd
    io = _output_io([("key", "string"), ("when", "timestamp")])
    assert io._atomic_types is None
    frame = pd.DataFrame({"key": ["a"], "when": pd.to_datetime(["2026-01-01"])})
    io.outputs = [frame]
    assert io.output_batch().equals(_pyspark_output(io, [frame]))


@pytest.mark.parametrize("case", ["numeric", "strings", "nullable", "zoned", "unnamed",
                                  "repeated", "empty"])
def test_columns_side_by_side_as_concat_puts_them(case):
    """PandasIO.frame_of gives what pd.concat(columns, axis=1) gives, fast path or not."""
    import pandas as pd

    from arrowstate.families.pandas_io import PandasIO
    io = PandasIO({"runnerConf": {}, "outputSchema": '{"type":"struct","fields":[]}'})
    n = 0 if case == "empty" else 4
    base = [pd.Series(np.arange(n), name="a"), pd.Series(np.arange(n) / 3, name="b"),
            pd.Series([f"s{i}" for i in range(n)], name="c", dtype=object)]
    extra = {"numeric": [], "strings": [pd.Series([None, "x", "y", None][:n], name="d")],
             "nullable": [pd.Series(pd.array([1, None, 3, 4][:n], dtype="Int64"), name="d")],
             "zoned": [pd.Series(pd.date_range("2026-01-01", periods=n, tz="UTC"), name="d")],
             "unnamed": [pd.Series(np.arange(n))],
             "repeated": [pd.Series(np.arange(n), name="a")], "empty": []}[case]
    columns = base + extra
    expected = pd.concat(columns, axis=1)
    got = io.frame_of(columns)
    pd.testing.assert_frame_equal(got, expected)
    assert list(got.columns) == list(expected.columns)


@pytest.mark.parametrize("nulls", [False, True])
@pytest.mark.parametrize("prefer_int_ext_dtype", [False, True])
def test_plain_columns_convert_as_pysparks_conversion(nulls, prefer_int_ext_dtype):
    """A batch's value frame and key values from Arrow directly (PandasIO.plain_frame and
    plain_values) are those pyspark's conversion gives, nulls included; another type, a
    repeated name or pyspark's integer extension types take pyspark's conversion."""
    import pandas as pd

    from arrowstate.families.pandas_io import PandasIO
    conf = {"spark.sql.execution.pythonUDF.pandas.preferIntExtensionDtype":
            str(prefer_int_ext_dtype).lower()}
    io = PandasIO({"runnerConf": conf, "outputSchema": '{"type":"struct","fields":[]}'})
    cut = ProcessorInput({"pandas": True, "maxRecordsPerBatch": 10}, io, Row)
    gap = [None] if nulls else [1]
    columns = {"k": pa.array(["a", "a", "b"]), "n": pa.array([1, 2] + gap, pa.int64()),
               "x": pa.array([0.5, float("nan")] + gap, pa.float64()),
               "flag": pa.array([True, False] + [None if nulls else True]),
               "s": pa.array(["u", "v"] + [None if nulls else "w"]),
               "big": pa.array(["u", "v", "w"], pa.large_string()),
               "small": pa.array([1, 2, 3], pa.int32()),
               "kn": pa.array([7, 7] + gap, pa.int64())}
    batch = pa.record_batch(list(columns.values()), names=list(columns))
    index = {name: i for i, name in enumerate(columns)}

    def pyspark_way(values, keys):
        series = io.to_pandas(batch)
        from arrowstate.families.transform_with_state.processor_input import _as_from_rows
        return (_as_from_rows(io.frame_of([series[i] for i in values])),
                [series[i].tolist() for i in keys])

    for values, keys, plain in [
            (["n", "x", "flag", "s", "big"], ["k"], not prefer_int_ext_dtype),
            (["n"], ["kn", "k"], not prefer_int_ext_dtype),
            (["n", "small"], ["k"], False), (["n", "n"], ["k"], False)]:
        values, keys = [index[v] for v in values], [index[k] for k in keys]
        assert (io.plain_frame(batch, values) is not None) == plain
        frame, key_values = cut._pandas_columns(batch, keys, values)
        expected_frame, expected_keys = pyspark_way(values, keys)
        pd.testing.assert_frame_equal(frame, expected_frame)
        # the same values of the same types (repr: a NaN key equals itself)
        assert [list(map(type, k)) for k in key_values] == [list(map(type, k))
                                                            for k in expected_keys]
        assert repr(key_values) == repr(expected_keys)
        frame.iloc[0, 0] = frame.iloc[1, 0]   # the function's to change, not Arrow's buffers
    assert batch.column(1)[0].as_py() == 1
