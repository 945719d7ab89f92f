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


def test_keys_of_every_supported_type_are_hashable_and_distinct():
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
    rows = keys.rows(cols, 3)
    assert len(set(rows)) == 3
    assert rows == keys.rows([c.slice(0) for c in cols], 3)
    assert keys.rows([], 2) == [(), ()]


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


def _put(state, key, value):
    batch = pa.RecordBatch.from_arrays(
        [pa.array([key[0]]), pa.array([key[1]], pa.timestamp("us", tz="UTC")),
         pa.array([value], pa.int64())], names=["a", "b", "c"])
    state.put_rows([key], batch)


def _contents(state):
    rows = state.take(state.live_ids())
    return dict(zip(state.data, rows.column(2).to_pylist()))


def test_delta_and_snapshot_chain_loads_each_version():
    state = _state()
    deltas, snapshots, expected = {}, {}, {}
    for version in range(1, 9):
        _put(state, (f"k{version}", _ts(version)), version)
        _put(state, ("same", _ts(0)), version)
        if version % 3 == 0:
            removed = state.pop_present([(f"k{version - 1}", _ts(version - 1)), ("nope", 0)])
            assert removed.column(2).to_pylist() == [version - 1]
        state.wait_for_snapshot()   # made in a thread: wait, so the test knows when it ships
        deltas[version], shipped = state.commit_files(version)
        snapshots.update(shipped)
        state.mark_committed(version, min_deltas_for_snapshot=4)
        expected[version] = _contents(state)
    # the snapshot of version 4 is made after its commit and shipped with version 5's
    assert sorted(snapshots) == [4]
    for target in range(1, 9):
        base = max([v for v in snapshots if v <= target], default=0)
        chain = ([(f"{base}.snapshot", snapshots[base])] if base else []) + [
            (f"{v}.delta", deltas[v]) for v in range(base + 1, target + 1)]
        loaded = _state()
        loaded.load(chain, target)
        assert _contents(loaded) == expected[target] and loaded.version == target


def test_rows_survive_chunk_merges_and_compaction():
    state = VersionedState([pa.field("k", pa.int64())], [pa.field("v", pa.string())])
    expected = {}
    for round_ in range(40):
        ks = np.arange(round_ * 3000, round_ * 3000 + 5000) % 20000
        values = [f"{k}-{round_}" for k in ks.tolist()]
        state.put_rows(ks.tolist(),
                       pa.RecordBatch.from_arrays([pa.array(ks), pa.array(values)], ["k", "v"]))
        expected.update(zip(ks.tolist(), values))
        gone = [k for k in range(round_, 20000, 97)] * 2
        popped = state.pop_present(gone)
        assert sorted(popped.column(0).to_pylist()) == sorted(set(gone) & set(expected))
        for k in gone:
            expected.pop(k, None)
        state.mark_committed(round_ + 1, 1000)
    assert len(state._chunks) <= 12
    rows = state.take(state.live_ids())
    assert dict(zip(rows.column(0).to_pylist(), rows.column(1).to_pylist())) == expected
    ids = state.lookup([5, -1, 19999])
    assert ids[1] == -1 and (ids[0] >= 0) == (5 in state.data)


def test_corrupt_or_foreign_file_is_refused_with_its_name():
    with pytest.raises(CorruptStateFile, match="3.delta"):
        _state().load([("3.delta", b"garbage")], 3)
    other = VersionedState([pa.field("k0", pa.int64())], [])
    other.put_rows([(1,)], pa.RecordBatch.from_arrays([pa.array([1])], ["k"]))
    delta, _ = other.commit_files(1)
    with pytest.raises(CorruptStateFile, match="columns"):
        _state().load([("1.delta", delta)], 1)


def test_time_index_pops_only_what_expires():
    index = TimeIndex()
    index.add_many(np.array([7], dtype=np.int64), ["b"])
    index.add_many(np.array([5, 10, 20], dtype=np.int64), ["a", "b", "c"])
    keys, times = index.pop_until(10)
    assert sorted(zip(keys, times.tolist())) == [("a", 5), ("b", 7), ("b", 10)]
    assert index.pop_until(15)[0] == [] and len(index) == 1
    assert index.pop_until(25)[0] == ["c"] and len(index) == 0




def test_fixed_width_keys_keep_spark_equality():
    ints = pa.array([1, 1, 1, 1, 1, None], pa.int64())
    floats = pa.array([0.0, -0.0, None, float("nan"), float("nan"), 0.0])
    k = keys.rows([ints, floats], 6)
    assert k[0] == k[1] and k[3] == k[4]
    assert len({k[0], k[2], k[3], k[5]}) == 4
    assert keys.rows([ints.slice(0, 0), floats.slice(0, 0)], 0) == []
