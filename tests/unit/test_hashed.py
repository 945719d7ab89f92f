"""The hash-table store (HashedRows) against the dict store (KeyedRows), without Spark."""
import numpy as np
import pyarrow as pa
import pytest

from arrowstate import keys
from arrowstate.store import VersionedState, hashed
from arrowstate.store.hashed import HashedRows
from arrowstate.store.rows import KeyedRows
from test_tier import KINDS, _schema, assert_answers_alike, both_keys


def _text(batch):
    return sorted(map(str, batch.to_pylist()))   # as text: NaN is NaN


@pytest.mark.parametrize("colliding", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_hashed_rows_answer_as_the_dict_store(monkeypatch, kind, colliding):
    """Random puts (repeated keys in a batch included), removals and compactions: every
    lookup, row, removal, first absent key and count as KeyedRows gives them. With
    `colliding`, keys wider than a word get one of 8 words, so nearly every key shares its
    word with others and lives in the overflow dict or beside one there."""
    monkeypatch.setattr(hashed, "_MIN_DEAD_FOR_COMPACTION", 100)
    if colliding:
        words = HashedRows._words
        monkeypatch.setattr(HashedRows, "_words",
                            lambda self, k: words(self, k) if self._exact
                            else words(self, k) & 7)
    schema = _schema(kind)
    dtype = keys.key_dtype(list(schema)[:-1])
    ours, theirs = HashedRows(schema, dtype), KeyedRows(schema)
    assert ours._exact == (kind == "long not null")
    rng = np.random.default_rng(11)

    for step in range(150):
        raw = rng.integers(-1 if kind != "long not null" else 0, 2000,
                           int(rng.integers(1, 300)))
        ours_keys, their_keys, cols = both_keys(kind, dtype, raw)
        action = rng.random()
        if action < 0.6:
            batch = pa.RecordBatch.from_arrays(cols + [pa.array(rng.integers(0, 99, len(raw)))],
                                               schema=schema)
            ours.insert(ours_keys, batch)
            theirs.insert(their_keys, batch)
        elif action < 0.8:
            assert _text(ours.pop_present(ours_keys)) == _text(theirs.pop_present(their_keys))
        elif action < 0.9:
            ours.discard(ours_keys)
            theirs.discard(their_keys)
        else:
            a, b = ours.lookup(ours_keys), theirs.lookup(their_keys)
            found = np.flatnonzero(a >= 0)
            assert _text(ours.pop_found(ours_keys[found], a[found])) == _text(
                theirs.pop_found(KeyedRows.pick(their_keys, found), b[found]))
        if step % 10 == 9:
            ours.compact_if_sparse()
            theirs.compact_if_sparse()
        probes = both_keys(kind, dtype, rng.integers(-1, 2000, 300))
        assert_answers_alike(ours, theirs, probes, step)
    if colliding and not ours._exact:
        assert ours._overflow
    assert ours._dead < 4 * max(len(ours), 100)   # compactions ran
    rows = pa.Table.from_batches(list(ours.all_rows(100)), schema)
    assert _text(rows) == _text(pa.Table.from_batches(list(theirs.all_rows(100)), schema))
    # each key as items() gives it is the key of its row
    for part_keys, part_rows in ours.items(64):
        assert (part_keys == keys.key_array(part_rows.columns[:-1], part_rows.num_rows, dtype,
                                            (12345, 678))).all()
    assert ours.memory_bytes() > 0 and ours.disk_bytes() == 0 and ours.spill() == 0


def test_the_last_row_of_a_key_repeated_in_a_batch_wins():
    schema = pa.schema([("k0", pa.int64()), ("v1", pa.string())])
    dtype = keys.key_dtype([schema.field(0)])
    rows = HashedRows(schema, dtype)
    cols = [pa.array([1, 2, 1, None, 1, None]), pa.array(list("abcdef"))]
    rows.insert(keys.key_array(cols[:1], 6, dtype),
                pa.RecordBatch.from_arrays(cols, schema=schema))
    probe = keys.key_array([pa.array([1, 2, None, 3])], 4, dtype)
    ids = rows.lookup(probe)
    assert rows.take(ids[:3]).column(1).to_pylist() == ["e", "b", "f"] and ids[3] == -1
    assert len(rows) == 3


def test_versioned_state_takes_the_hash_table_where_a_family_asks_and_keys_allow():
    value = [pa.field("n", pa.int64())]
    def store(fields, **kw):
        return type(VersionedState(fields, value, hashed=True, **kw).rows)
    assert store([pa.field("k", pa.int64())]) is HashedRows
    assert store([pa.field("u", pa.string()), pa.field("t", pa.timestamp("us"))]) is HashedRows
    assert store([pa.field("k", pa.list_(pa.int64()))]) is KeyedRows
    assert store([pa.field("k", pa.int64()), pa.field("s", pa.int64())],
                 prefix_count=1) is KeyedRows
    assert type(VersionedState([pa.field("k", pa.int64())], value).rows) is KeyedRows


def test_a_pandas_without_the_tables_methods_keeps_keys_in_a_dict(monkeypatch):
    monkeypatch.setattr(hashed, "AVAILABLE", False)
    state = VersionedState([pa.field("k", pa.int64())], [pa.field("n", pa.int64())],
                           hashed=True)
    assert type(state.rows) is KeyedRows and state.key_dtype is None
