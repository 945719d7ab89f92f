"""The hash-table store (HashedRows) against the dict store (KeyedRows), without Spark."""
import numpy as np
import pyarrow as pa
import pytest

from arrowstate import keys
from arrowstate.store.versions.versioned import VersionedState
from arrowstate.store.rows import hashed
from arrowstate.store.rows.hashed import HashedRows
from arrowstate.families import Deduplicate
from arrowstate.store.rows.keyed import KeyedRows
from family_tasks import TS, commit, seconds
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
    monkeypatch.setattr(hashed, "MIN_DEAD_FOR_COMPACTION", 100)
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


def _filled(fields, n=20, **kw):
    """A state of n keys (0..n-1 in every key column's type), committed."""
    state = VersionedState(fields, [pa.field("n", pa.int64())], **kw)
    ids = np.arange(n)
    cols = [pa.array(ids).cast(f.type) if not pa.types.is_list(f.type)
            else pa.array([[int(i)] for i in ids], f.type) for f in fields]
    state.put_rows(state.keys(cols, n), pa.RecordBatch.from_arrays(
        cols + [pa.array(ids)], schema=state.schema))
    commit(state, 1)
    return state


def test_a_large_state_of_fixed_width_keys_moves_to_the_hash_table_between_versions():
    long_, text = pa.field("k", pa.int64()), pa.field("u", pa.string())
    pair = [text, pa.field("t", pa.timestamp("us"))]
    state = _filled(pair, hashed=True)
    assert type(state.rows) is KeyedRows                    # every state starts in the dict
    assert not state.move_to_hash_table(21)                # not large enough
    before = _text(pa.Table.from_batches(list(state.rows.all_rows(7))))
    assert state.move_to_hash_table(20) and type(state.rows) is HashedRows
    assert _text(pa.Table.from_batches(list(state.rows.all_rows(7)))) == before
    probe = [pa.array(["3", "30"]), pa.array([3, 3]).cast(pa.timestamp("us"))]
    assert (state.rows.lookup(state.keys(probe, 2)) >= 0).tolist() == [True, False]
    assert not state.move_to_hash_table(1)                  # there already
    # not for: a family that did not ask, keys without a fixed width, a prefix key
    assert not _filled([long_]).move_to_hash_table(1)
    assert not _filled([pa.field("k", pa.list_(pa.int64()))], hashed=True).move_to_hash_table(1)
    assert not _filled([long_, pa.field("s", pa.int64())], hashed=True,
                       prefix_count=1).move_to_hash_table(1)
    pending = _filled([long_], hashed=True)   # nor with changes not yet committed
    pending.pop_present(pending.keys([pa.array([1])], 1))
    assert not pending.move_to_hash_table(1)


def test_a_pandas_without_the_tables_methods_keeps_keys_in_a_dict(monkeypatch):
    monkeypatch.setattr(hashed, "_TABLE", [None])
    state = _filled([pa.field("k", pa.int64())], hashed=True)
    assert not state.move_to_hash_table(1)
    assert type(state.rows) is KeyedRows and state.key_dtype is None


@pytest.mark.parametrize("within_watermark", [False, True])
def test_deduplication_answers_the_same_after_its_state_moves(within_watermark):
    """Two deduplications over the same batches, one whose state moves to the hash table
    (its time index rebuilt, as the worker does) after the second batch: the same masks,
    counts and state after every batch."""
    schema = pa.schema([("c0", pa.string()), ("c1", TS)])
    rng = np.random.default_rng(3)
    states = [None, None]
    for version in range(1, 7):
        users = [f"u{u}" for u in rng.integers(0, 40, 300).tolist()]
        times = seconds(*rng.integers(version * 20, version * 20 + 40, 300).tolist())
        batch = pa.RecordBatch.from_arrays([pa.array(users), times], schema=schema)
        operator = {"keyCount": 2, "eventTimeIndex": 1, "evictByKey": not within_watermark,
                    "withinWatermark": within_watermark, "delayMs": 5000,
                    "lateEventsWatermarkMs": (version * 20 - 10) * 1000,
                    "evictionWatermarkMs": (version * 20 - 10) * 1000}
        answers = []
        for i in range(2):
            family = Deduplicate(operator, schema)
            if states[i] is None:
                states[i] = VersionedState(family.key_fields, family.value_fields,
                                           hashed=True)
            state = states[i]
            mask = family.process(state, batch).column(0).to_pylist()
            list(family.finish(state))
            commit(state, version)
            if i == 1 and version == 2:
                assert state.move_to_hash_table(1)
                family.rebuild_index(state)
            counts = {k: v for k, v in family.metrics.items() if not k.endswith("TimeMs")}
            answers.append((mask, counts, len(state)))
        assert answers[0] == answers[1], version
    assert type(states[1].rows) is HashedRows and type(states[0].rows) is KeyedRows
