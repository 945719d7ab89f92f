"""The versioned store and key encoding, without Spark."""
import datetime as dt
import decimal

import numpy as np
import pyarrow as pa
import pytest

from arrowstate import keys
from arrowstate.store import CorruptStateFile, TimeIndex, VersionedState

KEY_FIELDS = [pa.field("k0", pa.string()), pa.field("k1", pa.timestamp("us", tz="UTC"))]
VALUE_FIELDS = [pa.field("v0", pa.int64())]


def test_keys_round_trip_every_supported_type():
    cols = [
        pa.array([1, None, 3], pa.int32()),
        pa.array(["a", None, "c"]),
        pa.array([b"x", None, b""]),
        pa.array([True, None, False]),
        pa.array([decimal.Decimal("1.10"), None, decimal.Decimal("2.00")], pa.decimal128(10, 2)),
        pa.array([dt.datetime(2020, 1, 1), None, dt.datetime(2021, 1, 1)], pa.timestamp("us")),
        pa.array([dt.date(2020, 1, 1), None, dt.date(1960, 1, 2)]),
        pa.array([1.5, None, -2.25], pa.float32()),
        pa.StructArray.from_arrays([pa.array([1, None, 3]), pa.array(["x", "y", None])],
                                   names=["a", "b"], mask=pa.array([False, False, True])),
        pa.array([[1, 2], None, []], pa.list_(pa.int64())),
    ]
    rows = keys.rows(cols)
    back = keys.columns(rows, [c.type for c in cols])
    for original, restored in zip(cols, back):
        assert original.equals(restored), (original, restored)


def test_float_keys_compare_like_spark():
    a = keys.column_values(pa.array([0.0, -0.0, float("nan"), float("nan")]))
    assert a[0] == a[1] and a[2] == a[3] and a[0] != a[2]


def test_null_struct_differs_from_struct_of_nulls():
    s = pa.StructArray.from_arrays([pa.array([None, None], pa.int64())], names=["a"],
                                   mask=pa.array([True, False]))
    v = keys.column_values(s)
    assert v[0] is None and v[1] == (None,)


def _state():
    return VersionedState(KEY_FIELDS, VALUE_FIELDS)


def _ts(s):
    return int(s * 1_000_000)


def test_delta_and_snapshot_chain_loads_each_version():
    state = _state()
    files = []
    expected = {}
    for version in range(1, 8):
        state.put((f"k{version}", _ts(version)), (version,))
        if version % 3 == 0:
            state.remove((f"k{version - 1}", _ts(version - 1)))
        delta, snapshot = state.commit_files(version, min_deltas_for_snapshot=4)
        files.append((version, delta, snapshot))
        state.mark_committed(version, snapshot is not None)
        expected[version] = dict(state.data)
    assert [v for v, _, s in files if s is not None] == [4]
    for target in range(1, 8):
        chain = ([(f"{target}.delta", d) for v, d, _ in files if v <= target] if target < 4
                 else [("4.snapshot", files[3][2])]
                 + [(f"{v}.delta", d) for v, d, _ in files if 4 < v <= target])
        loaded = _state()
        loaded.load(chain, target)
        assert loaded.data == expected[target] and loaded.version == target


def test_corrupt_or_foreign_file_is_refused_with_its_name():
    with pytest.raises(CorruptStateFile, match="3.delta"):
        _state().load([("3.delta", b"garbage")], 3)
    other = VersionedState([pa.field("k0", pa.int64())], [])
    other.put((1,))
    delta, _ = other.commit_files(1, 10)
    with pytest.raises(CorruptStateFile, match="columns"):
        _state().load([("1.delta", delta)], 1)


def test_time_index_pops_only_what_expires_and_skips_stale_entries():
    index = TimeIndex()
    current = {"a": 5, "b": 10, "c": 20}
    index.add_many(np.array([7], dtype=np.int64), ["b"])   # b moved on to 10: stale
    index.add_many(np.array(list(current.values()), dtype=np.int64), list(current))
    assert list(index.pop_until(10, current.get)) == ["a", "b"]
    assert list(index.pop_until(15, current.get)) == []
    assert len(index) == 1
    del current["c"]
    assert list(index.pop_until(25, current.get)) == [] and len(index) == 0
