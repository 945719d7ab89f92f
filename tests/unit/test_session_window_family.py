"""The session window family's state logic (restore, save, eviction and its indexes),
driven directly as the worker drives it: no Spark."""
import pyarrow as pa

from arrowstate import keys
from arrowstate.families import session_window
from family_tasks import SESSION, SESSION_SCHEMA, TS, commit, seconds as _seconds
from family_tasks import session_task as _sessions


def _session_rows(users, spans, counts=None):
    """Rows of (user, session [start, end), count); spans in seconds."""
    session = pa.StructArray.from_arrays(
        [_seconds(*[a for a, _ in spans]), _seconds(*[b for _, b in spans])],
        fields=list(SESSION))
    counts = counts if counts is not None else [1] * len(users)
    return pa.RecordBatch.from_arrays([pa.array(users), session, pa.array(counts)],
                                      schema=SESSION_SCHEMA)


def _sec(t):
    return int(t.timestamp())


def _restored(answer, batch):
    """The restore's output as (user, start, count, 'in'|'stored'), as the JVM builds it."""
    if answer is None:
        return [(u, _sec(s["start"]), c, "in") for u, s, c in zip(*batch.to_pydict().values())]
    out = []
    for row in answer.to_pylist():
        if row["pos"] >= 0:
            u, s, c = (batch.column(i)[row["pos"]].as_py() for i in range(3))
            out.append((u, _sec(s["start"]), c, "in"))
        else:
            out.append((row["v0"], _sec(row["v1"]["start"]), row["v2"], "stored"))
    return out


def test_session_restore_merges_stored_sessions_in_order_across_batches():
    family, state = _sessions("append")
    family.process(state, _session_rows(["a", "a", "a", "b"],
                                        [(10, 20), (30, 40), (50, 60), (5, 15)], [1, 2, 3, 4]))
    list(family.finish(state))
    commit(state, 1)
    family, _ = _sessions("append", lateEventsWatermarkMs=12000)   # the next task
    # a@2 is late ([2, 12) ends at the watermark); a@5 goes before a's first session, a@30
    # after the stored one of the same start; a's session at 50 waits: a's rows go on in
    # the next batch
    first = _session_rows(["a", "a", "a"], [(2, 12), (5, 15), (30, 40)], [0, 7, 8])
    assert _restored(family.lookup(state, first.select([0, 1])), first) == [
        ("a", 5, 7, "in"), ("a", 10, 1, "stored"), ("a", 30, 2, "stored"), ("a", 30, 8, "in")]
    assert family.metrics["numRowsDroppedByWatermark"] == 1
    second = _session_rows(["a", "b", "c"], [(55, 65), (6, 16), (70, 80)], [9, 10, 11])
    assert _restored(family.lookup(state, second.select([0, 1])), second) == [
        ("a", 50, 3, "stored"), ("a", 55, 9, "in"), ("b", 5, 4, "stored"),
        ("b", 6, 10, "in"), ("c", 70, 11, "in")]
    assert family.metrics["numRowsDroppedByWatermark"] == 1
    empty = second.slice(0, 0)
    assert family.lookup(state, empty.select([0, 1])) is None   # nothing held back


def test_session_restore_hands_over_held_back_sessions_after_the_input_and_drops_late():
    family, state = _sessions("complete")
    family.process(state, _session_rows(["a", "a"], [(10, 20), (30, 40)]))
    list(family.finish(state))
    family, _ = _sessions("complete", lateEventsWatermarkMs=25000)
    rows = _session_rows(["a", "a"], [(1, 11), (12, 22)], [5, 6])
    answer = family.lookup(state, rows.select([0, 1]))
    assert answer.num_rows == 0   # every row late: a's sessions are not read
    assert family.metrics["numRowsDroppedByWatermark"] == 2
    rows = _session_rows(["a"], [(15, 26)], [7])
    assert _restored(family.lookup(state, rows.select([0, 1])), rows) == [
        ("a", 10, 1, "stored"), ("a", 15, 7, "in")]
    flushed = family.lookup(state, rows.slice(0, 0).select([0, 1]))
    assert _restored(flushed, rows) == [("a", 30, 1, "stored")]


def test_session_save_replaces_each_keys_sessions_even_across_batches():
    family, state = _sessions("append")
    family.process(state, _session_rows(["a", "a", "b"], [(10, 20), (30, 40), (1, 5)]))
    list(family.finish(state))
    assert family.metrics["numUpdatedStateRows"] == 3 and len(state) == 3
    commit(state, 1)
    family, _ = _sessions("append")
    # a's sessions joined into [10, 45) and a new one, in two batches; b kept as it was
    family.process(state, _session_rows(["a"], [(10, 45)], [3]))
    assert len(state) == 3   # a may go on: nothing applied yet
    family.process(state, _session_rows(["a", "b"], [(50, 60), (1, 5)]))
    list(family.finish(state))
    m = family.metrics
    assert (m["numUpdatedStateRows"], m["numRemovedStateRows"], len(state)) == (3, 1, 3)
    starts = sorted((r["k0"], _sec(r["k1"])) for r in
                    pa.Table.from_batches(list(state.rows.all_rows(10))).to_pylist())
    assert starts == [("a", 10), ("a", 50), ("b", 1)]


def test_session_eviction_skips_extended_and_merged_sessions_and_survives_a_reload():
    family, state = _sessions("append")
    family.process(state, _session_rows(["a", "a", "b"], [(10, 20), (30, 40), (1, 5)]))
    list(family.finish(state))
    commit(state, 1)
    family, _ = _sessions("append")
    family.process(state, _session_rows(["a", "b"], [(10, 45), (1, 25)]))   # 30 merged
    list(family.finish(state))
    commit(state, 2)
    family, _ = _sessions("append", evictionWatermarkMs=40000)
    out = list(family.finish(state))   # [10, 45) outlives 40 s; b's [1, 25) does not
    assert [(r["v0"], _sec(r["v1"]["end"])) for b in out for r in b.to_pylist()] == [("b", 25)]
    assert family.metrics["numRemovedStateRows"] == 1 and len(state) == 1
    commit(state, 3)
    state.index = type(state.index)()   # as after a load
    family, _ = _sessions("append", evictionWatermarkMs=45000)
    family.rebuild_index(state)
    out = list(family.finish(state))
    assert [_sec(r["v1"]["end"]) for b in out for r in b.to_pylist()] == [45]
    assert len(state) == 0
    family, _ = _sessions("append")   # a's evicted session is not handed over again
    rows = _session_rows(["a"], [(100, 110)], [5])
    assert _restored(family.lookup(state, rows.select([0, 1])), rows) == [("a", 100, 5, "in")]


def test_session_handed_over_and_saved_keeps_its_entry_and_an_extended_one_comes_back():
    family, state = _sessions("append")
    family.process(state, _session_rows(["a", "b"], [(10, 20), (1, 5)]))
    list(family.finish(state))
    commit(state, 1)
    assert len(state.index) == 2
    family, _ = _sessions("append")
    rows = _session_rows(["a", "b"], [(12, 30), (2, 5)], [1, 1])
    family.lookup(state, rows.select([0, 1]))   # hands over a@10 and b@1
    # as the JVM merged them: a's session extended to 30 s, b's as it was
    family.process(state, _session_rows(["a", "b"], [(10, 30), (1, 5)], [2, 2]))
    list(family.finish(state))
    commit(state, 2)
    assert len(state.index) == 2   # nothing entered again
    family, _ = _sessions("append", evictionWatermarkMs=25000)
    out = list(family.finish(state))   # a's entry at 20 s finds it ending at 30: back in
    assert [(r["v0"], _sec(r["v1"]["end"])) for b in out for r in b.to_pylist()] == [("b", 5)]
    assert len(state.index) == 1 and len(state) == 1
    commit(state, 3)
    family, _ = _sessions("append", evictionWatermarkMs=30000)
    out = list(family.finish(state))
    assert [(r["v0"], _sec(r["v1"]["end"])) for b in out for r in b.to_pylist()] == [("a", 30)]
    assert len(state) == 0 and len(state.index) == 0


def test_session_index_is_built_again_once_evicted_sessions_outnumber_live_ones(monkeypatch):
    monkeypatch.setattr(session_window, "_MIN_EVICTED_FOR_REBUILD", 0)
    family, state = _sessions("append")
    family.process(state, _session_rows(["a", "a", "b", "c"],
                                        [(10, 20), (30, 40), (1, 5), (2, 6)], [1, 2, 3, 4]))
    list(family.finish(state))
    commit(state, 1)
    family, _ = _sessions("append", evictionWatermarkMs=10000)
    assert len(list(family.finish(state))) == 1   # b and c: 2 evicted, 2 live
    assert state.objects["sessions"].keys() == {b"a", b"b", b"c"}
    commit(state, 2)
    family, _ = _sessions("append", evictionWatermarkMs=25000)
    list(family.finish(state))   # a's first: 3 evicted, 1 live
    assert "sessions" not in state.objects
    family, _ = _sessions("append")
    rows = _session_rows(["a", "b"], [(35, 45), (7, 9)], [5, 6])
    assert _restored(family.lookup(state, rows.select([0, 1])), rows) == [
        ("a", 30, 2, "stored"), ("a", 35, 5, "in"), ("b", 7, 6, "in")]
    # a's one stored session: its state key, the key and the session's start
    stored = keys.rows([pa.array(["a"]), pa.array([30_000_000], TS)], 1)
    assert state.objects["sessions"] == {b"a": (stored[0],)}
