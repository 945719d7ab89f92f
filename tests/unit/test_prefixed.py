"""The hash-table store that finds rows by key prefix (PrefixedHashedRows), which session
windows' state takes without a memory budget, against the dict store and the tier, and the
session family over it against the family over the tier: no Spark."""
import numpy as np
import pyarrow as pa
import pytest

from arrowstate.families import session_window
from arrowstate.store.versions.versioned import VersionedState
from arrowstate.store.rows import hashed
from arrowstate.store.held.budget import MemoryBudget
from arrowstate.store.tier.tiered import TierPlace
from arrowstate.store.rows.hashed import HashedRows
from arrowstate.store.rows.prefixed import PrefixedHashedRows
from arrowstate.store.rows.keyed import KeyedRows
from arrowstate.store.tier.tiered import TieredRows
from family_tasks import SESSION, SESSION_SCHEMA, commit, seconds
from test_hashed import _text
from test_budget import _header
from test_tier import assert_answers_alike, assert_scan_finds_live_sessions, random_sessions


def _sessions_state(group_type, tier):
    fields = [pa.field("g", group_type), pa.field("start", pa.timestamp("us"))]
    return VersionedState(fields, [pa.field("v", pa.int64())], tier=tier, prefix_count=1,
                          hashed=True)


def _session_keys(state, g, start, group_type):
    cols = [pa.array(g, group_type, mask=g == 0),   # the null group is a group too
            pa.array(start, pa.timestamp("us"))]
    return state.keys(cols, len(g)), state.rows.pick, cols


@pytest.mark.parametrize("colliding", [False, True])
@pytest.mark.parametrize("group_type", [pa.int64(), pa.int32()])
def test_prefixed_rows_answer_as_the_dict_store_and_scan_each_groups_live_rows(
        tmp_path, monkeypatch, group_type, colliding):
    """Random puts (repeats in a batch), removals and compactions of sessions (a group and
    a start): every lookup, row, removal and count as KeyedRows gives them, and each scan
    exactly the live sessions of the groups asked for. A long group is a prefix of 9
    bytes (hashed to its word), an int one of 5 (its own word). With `colliding` hashed
    keys' and prefixes' words are one of 8, so nearly every one shares its word."""
    monkeypatch.setattr(hashed, "MIN_DEAD_FOR_COMPACTION", 100)
    if colliding:
        words, prefix_words = HashedRows._words, PrefixedHashedRows._prefix_words
        monkeypatch.setattr(HashedRows, "_words", lambda self, k: words(self, k) if
                            self._exact else words(self, k) & 7)
        monkeypatch.setattr(PrefixedHashedRows, "_prefix_words", lambda self, p: prefix_words(
            self, p) if self._prefix_exact else prefix_words(self, p) & 7)
    state = _sessions_state(group_type, TierPlace(str(tmp_path / "t"), 2 ** 63 - 1))
    rows, theirs = state.rows, KeyedRows(state.schema)
    assert type(rows) is PrefixedHashedRows
    assert rows._prefix_exact == (group_type == pa.int32())
    live: dict = {}
    rng = np.random.default_rng(5)
    for step in range(200):
        g, start = random_sessions(rng)
        n = len(g)
        ours_keys, _, cols = _session_keys(state, g, start, group_type)
        their_keys = [tuple(r.values()) for r in pa.table(cols, names=["a", "b"]).to_pylist()]
        names = [(-1 if gi == 0 else int(gi), int(s)) for gi, s in zip(g, start)]
        action = rng.random()
        if action < 0.6:
            value = rng.integers(0, 1000, n)
            batch = pa.RecordBatch.from_arrays(cols + [pa.array(value)], schema=state.schema)
            rows.insert(ours_keys, batch)
            theirs.insert(their_keys, batch)
            live.update(zip(names, value.tolist()))
        else:
            if action < 0.85:
                assert _text(rows.pop_present(ours_keys)) == _text(
                    theirs.pop_present(their_keys)), step
            else:
                key_rows = pa.RecordBatch.from_arrays(cols, names=["k0", "k1"])
                rows.discard(ours_keys, key_rows)
                theirs.discard(their_keys, key_rows)
            for name in names:
                live.pop(name, None)
        if step % 10 == 9:
            rows.compact_if_sparse()
            theirs.compact_if_sparse()
        assert_scan_finds_live_sessions(state, rng, group_type, live, step)
        probe_g, probe_s = rng.integers(0, 400, 200), rng.integers(0, 60, 200) * 1000
        probe, _, probe_cols = _session_keys(state, probe_g, probe_s, group_type)
        their_probe = [tuple(r.values())
                       for r in pa.table(probe_cols, names=["a", "b"]).to_pylist()]
        assert_answers_alike(rows, theirs, (probe, their_probe, probe_cols), step)
    assert rows._dead < 4 * max(len(rows), 100)   # compactions ran
    if colliding and not rows._prefix_exact:
        assert rows._overflow
    assert rows.memory_bytes() > 0 and rows.disk_bytes() == 0 and rows.spill() == 0


def test_a_prefixed_family_without_a_budget_gets_the_prefixed_table(tmp_path, monkeypatch):
    """Without a budget, a family that asks for hashed keys and has a prefix (session
    windows) gets the table; with a budget, or where pandas has no such table, the tier;
    a family with a prefix that does not ask (transformWithState) the tier's runs."""
    b = MemoryBudget()
    b.configure(_header(0, local_dir=str(tmp_path)))
    place = b.place("/ck/state/0/1", without_budget=True)
    assert not place.spills
    assert type(_sessions_state(pa.int64(), place).rows) is PrefixedHashedRows
    budgeted = TierPlace(str(tmp_path / "b"), memory_cap=1 << 20)
    assert budgeted.spills and type(_sessions_state(pa.int64(), budgeted).rows) is TieredRows
    fields = [pa.field("g", pa.int64()), pa.field("start", pa.timestamp("us"))]
    assert type(VersionedState(fields, [pa.field("v", pa.int64())], tier=place,
                               prefix_count=1).rows) is TieredRows
    monkeypatch.setattr(hashed, "_TABLE", [None])
    assert type(_sessions_state(pa.int64(), place).rows) is TieredRows


def _restored(answer, batch):
    """The restore's output as (user, start, end, count, 'in'|'stored') in seconds, as the
    JVM builds it from the answer and the input."""
    if answer is None:
        return [(u, int(s["start"].timestamp()), int(s["end"].timestamp()), c, "in")
                for u, s, c in zip(*batch.to_pydict().values())]
    out = []
    for row in answer.to_pylist():
        if row["pos"] >= 0:
            u, s, c = (batch.column(i)[row["pos"]].as_py() for i in range(3))
            kind = "in"
        else:
            u, s, c, kind = row["v0"], row["v1"], row["v2"], "stored"
        out.append((u, int(s["start"].timestamp()), int(s["end"].timestamp()), c, kind))
    return out


def _merged(restored):
    """What Spark's MergingSessionsExec makes of the restore's output (sorted by key and
    start): overlapping sessions of a key merged, their counts summed."""
    out = []
    for user, start, end, count in restored:
        if out and out[-1][0] == user and start <= out[-1][2]:
            last = out[-1]
            out[-1] = (user, last[1], max(last[2], end), last[3] + count)
        else:
            out.append((user, start, end, count))
    return out


def _rows(sessions):
    session = pa.StructArray.from_arrays(
        [seconds(*[s for _, s, _, _ in sessions]), seconds(*[e for _, _, e, _ in sessions])],
        fields=list(SESSION))
    return pa.RecordBatch.from_arrays(
        [pa.array([u for u, _, _, _ in sessions], pa.string()), session,
         pa.array([c for _, _, _, c in sessions], pa.int64())], schema=SESSION_SCHEMA)


def test_the_session_family_answers_the_same_over_the_prefixed_table_and_the_tier(tmp_path):
    """Batches of random sessions (a user's rows close enough to merge with each other and
    with stored sessions, some late, the input cut into several restore and save calls)
    through the family over each store: the same restore answers, output, metrics and
    state after every batch."""
    rng = np.random.default_rng(9)
    places = [TierPlace(str(tmp_path / "hash"), 2 ** 63 - 1),
              TierPlace(str(tmp_path / "runs"), 1 << 20)]
    states, seen = [None, None], []
    for version in range(1, 9):
        base = version * 40
        n = 400
        users = [f"u{u}" for u in rng.integers(0, 60, n).tolist()]
        starts = rng.integers(base - 15, base + 40, n).tolist()
        spans = sorted((u, s, s + 10, 1) for u, s in zip(users, starts))
        batch = _rows(spans)
        watermark = (base - 20) * 1000
        answers = []
        for i in range(2):
            family = session_window.SessionWindow(
                {"keyIndexes": [0], "sessionIndex": 1, "eventTimeIndex": 1,
                 "outputMode": "append", "batchSize": 64, "lateEventsWatermarkMs": watermark,
                 "evictionWatermarkMs": watermark}, SESSION_SCHEMA)
            if states[i] is None:
                states[i] = VersionedState(family.key_fields, family.value_fields,
                                           tier=places[i], prefix_count=family.prefix_count,
                                           hashed=True)
            state = states[i]
            restored = []
            for lo in range(0, n, 150):   # restore calls; the last key's sessions may wait
                part = batch.slice(lo, 150)
                restored += _restored(family.lookup(state, part.select([0, 1])), part)
            restored += _restored(family.lookup(state, batch.slice(0, 0).select([0, 1])),
                                  batch.slice(0, 0))   # the held-back sessions
            saved = _rows(_merged(sorted(row[:4] for row in restored)))
            for lo in range(0, saved.num_rows, 100):
                family.process(state, saved.slice(lo, 100))
            out = [r for b in family.finish(state) for r in b.to_pylist()]
            commit(state, version)
            metrics = {k: v for k, v in family.metrics.items() if not k.endswith("Ms")}
            answers.append((restored, sorted(map(str, out)), metrics, len(state)))
        assert answers[0] == answers[1], version
        seen.append((answers[0][2]["numRemovedStateRows"],
                     sum(row[4] == "stored" for row in answers[0][0])))
    assert all(removed and stored for removed, stored in seen[1:]), seen
    assert type(states[0].rows) is PrefixedHashedRows and type(states[1].rows) is TieredRows
    for state in states:
        state.close()
