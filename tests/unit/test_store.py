"""The versioned store and key encoding, without Spark."""
import datetime as dt
import decimal

import numpy as np
import pyarrow as pa
import pytest

from arrowstate import keys
from arrowstate.store.formats.container import CorruptStateFile
from arrowstate.store.lifecycle.chains import MissingStateFiles
from arrowstate.store.versions.time_index import TimeIndex
from arrowstate.store.versions.versioned import VersionedState
from arrowstate.store.lifecycle.chains import load_plans
from arrowstate.store.rows.keyed import KeyedRows
from dict_files import DictFiles

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


def _key(name, micros):
    """The key the store uses for (name, time): as `keys.rows` makes it from columns."""
    return keys.rows([pa.array([name]), pa.array([micros], pa.timestamp("us", tz="UTC"))], 1)[0]


def _put(state, key, value):
    batch = pa.RecordBatch.from_arrays(
        [pa.array([key[0]]), pa.array([key[1]], pa.timestamp("us", tz="UTC")),
         pa.array([value], pa.int64())], names=["a", "b", "c"])
    state.put_rows([_key(*key)], batch)


def _contents(state):
    rows = state.rows.take(state.rows.live_ids())
    return dict(zip(state.rows.data, rows.column(2).to_pylist()))


def test_delta_and_snapshot_chain_loads_each_version():
    state = _state()
    written, expected, prunes = {}, {}, []
    for version in range(1, 13):
        _put(state, (f"k{version}", _ts(version)), version)
        _put(state, ("same", _ts(0)), version)
        if version % 3 == 0:
            removed = state.pop_present([_key(f"k{version - 1}", _ts(version - 1)),
                                         _key("nope", 0)])
            assert removed.column(2).to_pylist() == [version - 1]
        # made in a thread: wait, so the test knows when it ships
        state.lifecycle.wait_for_snapshot()
        done = state.commit_files(version, min_versions_to_retain=3)
        written.update(done.written())
        written.update(done.snapshots)
        prune_below = done.prune_below
        if prune_below > 0:
            prunes.append((version, prune_below))
        state.mark_committed(version, min_deltas_for_snapshot=4)
        expected[version] = _contents(state)
    # the snapshot of version 4 is made after its commit and shipped with version 5's
    assert sorted(n for n in written if "snapshot" in n) == [
        "4.arrowstate.snapshot", "8.arrowstate.snapshot"]
    # retention of 3 versions: once version 6 is committed, 4 is the oldest kept and its
    # snapshot makes everything before it unneeded; then 8's, at version 10
    assert prunes == [(6, 4), (10, 8)]
    for target in range(1, 13):
        loaded = _state()
        loaded.load(DictFiles(written), target)
        assert _contents(loaded) == expected[target] and loaded.version == target
        assert loaded.lifecycle.last_snapshot_version == (8 if target >= 8 else
                                                          4 if target >= 4 else 0)


@pytest.mark.parametrize("worker_makes_it", [True, False])
def test_a_small_states_snapshot_waits_for_the_worker_a_large_ones_has_a_thread(
        monkeypatch, worker_makes_it):
    """A snapshot of a state within INLINE_MAX_BYTES starts no thread: the worker makes it
    once its task's answers went (or, had it not, the next commit does), and it ships with
    the next commit as a threaded one does; a larger state's is made in a thread at once."""
    from arrowstate.store.lifecycle import snapshots
    started = []
    thread = snapshots.threading.Thread
    monkeypatch.setattr(snapshots.threading, "Thread",
                        lambda *a, **k: started.append(k["name"]) or thread(*a, **k))
    state, written = _state(), {}

    def commit(version):
        _put(state, (f"k{version}", _ts(version)), version)
        done = state.commit_files(version, min_versions_to_retain=100)
        written.update(done.written())
        written.update(done.snapshots)
        state.mark_committed(version, min_deltas_for_snapshot=2)
        return [name for name, _ in done.snapshots]

    assert commit(1) == [] and not state.snapshot_waits()
    assert commit(2) == [] and state.snapshot_waits()
    if worker_makes_it:
        state.make_waiting_snapshot()
        assert not state.snapshot_waits()
    assert commit(3) == ["2.arrowstate.snapshot"] and started == []
    monkeypatch.setattr(snapshots, "INLINE_MAX_BYTES", 0)
    assert commit(4) == [] and not state.snapshot_waits()
    assert started == ["arrowstate-snapshot-4"]
    state.lifecycle.wait_for_snapshot()
    assert commit(5) == ["4.arrowstate.snapshot"]
    loaded = _state()
    loaded.load(DictFiles({n: c for n, c in written.items() if "delta" not in n or
                           n.startswith("5.")}), 5)
    assert _contents(loaded) == _contents(state)


def test_load_chain_takes_newest_snapshot_and_names_missing_deltas():
    names = ["1.arrowstate.delta", "2.arrowstate.delta", "2.arrowstate.snapshot",
             "3.arrowstate.delta", "5.arrowstate.delta", "2.delta", "x.arrowstate.delta"]
    plans, snapshots = load_plans(names, 3, "ck/state/0/1", "operator 0, partition 1")
    assert plans == [(["2.arrowstate.snapshot", "3.arrowstate.delta"], 2),
                     ([f"{v}.arrowstate.delta" for v in (1, 2, 3)], 0)]
    assert snapshots == [2]
    with pytest.raises(MissingStateFiles, match="ck/state/0/1/4.arrowstate.delta"):
        load_plans(names, 5, "ck/state/0/1", "operator 0, partition 1")


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
    assert len(state.rows._rows.chunks) <= 12
    rows = state.rows.take(state.rows.live_ids())
    assert dict(zip(rows.column(0).to_pylist(), rows.column(1).to_pylist())) == expected
    ids = state.rows.lookup([5, -1, 19999])
    assert ids[1] == -1 and (ids[0] >= 0) == (5 in state.rows.data)


def test_corrupt_or_foreign_file_is_refused_with_its_name():
    with pytest.raises(CorruptStateFile, match="ck/state/0/0/1.arrowstate.delta"):
        _state().load(DictFiles({"1.arrowstate.delta": b"garbage"}), 1)
    other = VersionedState([pa.field("k0", pa.int64())], [])
    other.put_rows([(1,)], pa.RecordBatch.from_arrays([pa.array([1])], ["k"]))
    with pytest.raises(CorruptStateFile, match="columns"):
        _state().load(DictFiles(other.commit_files(1, 100).written()), 1)


def test_named_columns_load_into_a_layout_with_more_columns_and_refuse_other_changes():
    from arrowstate.store.formats.decoding import StateColumnsChanged

    def named(*fields):
        return VersionedState([pa.field("k", pa.int64())], list(fields), named_columns=True)

    a, b = pa.field("s_a", pa.int64()), pa.field("s_b", pa.string())
    written = named(a)
    written.put_rows([1], pa.RecordBatch.from_arrays([pa.array([1]), pa.array([10])],
                                                     ["k", "s_a"]))
    files = DictFiles(written.commit_files(1, 100).written())
    grown = named(b, a)   # a column added, and the order changed with it
    grown.load(files, 1)
    assert grown.rows.take(grown.rows.live_ids()).to_pydict() == {
        "k0": [1], "v0": [None], "v1": [10]}
    with pytest.raises(StateColumnsChanged, match=r"does not declare: \['s_a'\]"):
        named(b).load(files, 1)
    with pytest.raises(StateColumnsChanged, match="s_a is int64 in the files but string"):
        named(pa.field("s_a", pa.string())).load(files, 1)


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


def test_strings_among_fixed_width_keys_keep_spark_equality():
    """Strings and binaries beside fixed-width columns make one bytes string per row: equal
    exactly when the rows are (null differs from empty, lengths keep parts apart, floats
    normalised, not-UTF-8 bytes compared as bytes, slices as whole arrays)."""
    words = pa.array(["ab", "a", "", None, "ab", "a"]).slice(0)
    tails = pa.array([b"c", b"bc", b"", b"", b"c", b"bc"], pa.large_binary())
    floats = pa.array([0.0, 0.0, 2.0, 2.0, -0.0, float("nan")])
    k = keys.rows([words, tails, floats], 6)
    assert all(isinstance(x, bytes) for x in k)
    assert k[0] == k[4] and len(set(k)) == 5   # ("ab", "c") and ("a", "bc") differ
    assert keys.rows([words.slice(4), tails.slice(4), floats.slice(4)], 2) == k[4:]
    raw = pa.array([b"\xff\xfe", b"\xff\xfe"], pa.binary()).view(pa.string())
    r = keys.rows([raw, pa.array([-0.0, 0.0])], 2)
    assert r[0] == r[1]


def test_string_keys_compare_by_bytes_even_when_not_utf8():
    raw = pa.array([b"\xff\xfe", b"ok", b"\xff\xfe", None], pa.binary()).view(pa.string())
    k = keys.column_values(raw)
    assert k[0] == k[2] and k[0] != k[1] and k[3] is None
    nested = pa.StructArray.from_arrays([raw, pa.array([1, 2, 1, 3])], names=["s", "n"])
    r = keys.rows([nested, pa.array([1, 1, 1, 1])], 4)
    assert r[0] == r[2] and len(set(r)) == 3


def test_pick_gathers_keys_at_positions_in_any_order():
    """KeyedRows.pick: every position in order (its shortcut), reversed, a few, none, a
    run that starts later, and repeats."""
    keys = [bytes([i % 256, i // 256 % 256, 7]) for i in range(5000)]
    for positions in (np.arange(5000), np.arange(5000)[::-1], np.array([0, 2, 4999]),
                      np.zeros(0, np.int64), np.array([0, 1]), np.arange(1, 5000),
                      np.array([0, 0] + list(range(2, 4999)) + [4999])):   # as long, not all
        picked = KeyedRows.pick(keys, positions)
        assert picked == [keys[i] for i in positions]
        assert picked is not keys


def test_first_absent_keys_are_stored_in_one_pass_as_the_two_steps_store_them():
    """put_first_absent keeps each key's first candidate that is not in state, stores those
    rows (the dict's one-pass claim and the tier's and hash table's two steps alike), and a
    failure while making the rows leaves the state as it was."""
    schema = pa.schema([("k", pa.string()), ("v", pa.int64())])
    state = VersionedState([schema.field(0)], [schema.field(1)])
    state.put_rows(state.keys([pa.array(["b"])], 1),
                   pa.RecordBatch.from_arrays([pa.array(["b"]), pa.array([0])], schema=schema))
    batch = pa.RecordBatch.from_arrays(
        [pa.array(["a", "b", "a", "c", "d", "c", "e"]), pa.array([1, 2, 3, 4, 5, 6, 7])],
        schema=schema)
    candidates = np.array([0, 1, 2, 3, 5, 6])   # row 4 ("d") is not a candidate (late)
    keys_ = state.keys(batch.columns[:1], batch.num_rows)

    def rows_of(positions):
        return batch.take(pa.array(positions))

    with pytest.raises(RuntimeError):
        state.put_first_absent(keys_, candidates, lambda p: (_ for _ in ()).throw(
            RuntimeError("disk full")))
    assert sorted(state.rows.data) == [b"b"] and len(state) == 1
    positions, new_keys, rows = state.put_first_absent(keys_, candidates, rows_of)
    assert positions.tolist() == [0, 3, 6] and new_keys == [b"a", b"c", b"e"]
    assert rows.column(1).to_pylist() == [1, 4, 7]
    found = state.rows.lookup(state.keys([pa.array(["a", "b", "c", "d", "e"])], 5))
    assert state.rows.take(found[found >= 0]).column(1).to_pylist() == [1, 0, 4, 7]
    assert found[3] == -1
    again, _, _ = state.put_first_absent(keys_, candidates, rows_of)
    assert len(again) == 0


def test_row_chunks_count_their_bytes_as_they_change():
    """RowChunks.nbytes is kept as chunks are appended, merged, rewritten and cleared: the
    same as Arrow's count of the chunks' buffers."""
    from arrowstate.store.rows.chunks import RowChunks
    schema = pa.schema([("k", pa.int64()), ("s", pa.string())])
    chunks = RowChunks(schema)
    for n in (1, 3, 2, 2, 8, 1, 40, 5):
        chunks.append(pa.record_batch([pa.array(range(n)), pa.array(["x" * n] * n)],
                                      schema=schema))
        assert chunks.nbytes() == sum(c.get_total_buffer_size() for c in chunks.chunks)
    chunks.keep_only(np.array([0, 5, 9, 40]))
    assert chunks.nbytes() == sum(c.get_total_buffer_size() for c in chunks.chunks) > 0
    chunks.clear()
    assert chunks.nbytes() == 0


@pytest.mark.parametrize("joined_max_rows", [0, 8192])
def test_row_chunks_take_rows_in_the_order_asked_from_one_chunk_or_many(
        monkeypatch, joined_max_rows):
    """A take by ids reads the same rows in the order asked, whether the chunks are one, few
    enough to join for one take (JOINED_TAKE_MAX_ROWS), or read a take per chunk."""
    from arrowstate.store.rows import chunks as chunks_module
    monkeypatch.setattr(chunks_module, "JOINED_TAKE_MAX_ROWS", joined_max_rows)
    schema = pa.schema([("k", pa.int64()), ("s", pa.string())])
    chunks = chunks_module.RowChunks(schema)
    for lo, n in ((0, 7), (7, 1), (8, 3)):
        chunks.append(pa.record_batch([pa.array(range(lo, lo + n)),
                                       pa.array([f"v{i}" for i in range(lo, lo + n)])],
                                      schema=schema))
    assert len(chunks.chunks) > 1
    for ids in ([9, 0, 7, 3, 10], [2, 2, 8], [10], list(range(11))):
        rows = chunks.take(np.array(ids))
        assert rows.schema == schema
        assert rows.column(0).to_pylist() == ids
        assert rows.column(1).to_pylist() == [f"v{i}" for i in ids]
    assert chunks.take(np.array([], dtype=np.int64)).num_rows == 0
    chunks.keep_only(np.array([1, 8, 10]))
    assert len(chunks.chunks) == 1
    assert chunks.take(np.array([2, 0])).column(1).to_pylist() == ["v10", "v1"]


def test_a_tiny_states_snapshot_is_uncompressed_a_larger_ones_compressed():
    """A snapshot made as bytes keeps its Arrow buffers uncompressed while its rows take at
    most COMPACT_MAX_BYTES (compressing costs more than it saves there), else compresses
    them with the store's codec; either loads back the same state."""
    from arrowstate.store.formats import encoding, files
    from arrowstate.store.formats.container import unique_id
    from arrowstate.store.lifecycle.snapshots import Snapshot
    for rows in (200, 20000):
        state = _state()
        names = [f"k{i}" for i in range(rows)]
        state.put_rows([_key(n, _ts(1)) for n in names], pa.RecordBatch.from_arrays(
            [pa.array(names), pa.array([_ts(1)] * rows, pa.timestamp("us", tz="UTC")),
             pa.array(range(rows), pa.int64())], names=["a", "b", "c"]))
        made = Snapshot(state.rows.frozen(), state.schema, 1, None, "lz4", (0, 0),
                        threaded=False).result()
        (name, data), = made.files
        stored = [files.with_op(b, files.OP_PUT) for b in state.rows.all_rows(1 << 16)]
        tiny = sum(b.get_total_buffer_size() for b in stored) <= files.COMPACT_MAX_BYTES
        assert tiny == (rows == 200)
        same, _ = encoding.encode(state.schema, "snapshot", 1, stored,
                                  codec=None if tiny else "lz4", uid=unique_id(data))
        assert data == same
        loaded = _state()
        loaded.load(DictFiles({name: data}), 1)
        assert _contents(loaded) == _contents(state)
