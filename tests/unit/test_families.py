"""Each operator family's state logic, driven directly as the worker drives it: no Spark."""
import base64
import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark.serializers import CloudPickleSerializer
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from arrowstate import contract
from arrowstate.families import REGISTRY, Aggregate, Deduplicate, FlatMapGroupsWithState
from arrowstate.families.base import grouped_by_key, sorted_by_key
from family_tasks import TS, commit, seconds as _seconds, session_task, task, tws_task

def _mask(answer):
    return answer.column(0).to_pylist()


def test_registry_is_the_contracts_families():
    assert set(REGISTRY) == set(contract.FAMILIES)
    for name, family in REGISTRY.items():
        assert family.name == name


DEDUP_SCHEMA = pa.schema([("c0", pa.string()), ("c1", TS)])


def _dedup(**operator):
    return task(Deduplicate, {"keyCount": 2, "eventTimeIndex": 1, "evictByKey": True,
                               "withinWatermark": False, **operator}, DEDUP_SCHEMA)


def test_dedup_keeps_first_of_each_key_drops_late_and_evicts_by_watermark():
    family, state = _dedup(lateEventsWatermarkMs=5000, evictionWatermarkMs=12000)
    batch = pa.RecordBatch.from_arrays([pa.array(["a", "a", "b", "c", None, None]),
                                        _seconds(10, 10, 3, 20, 11, 11)], schema=DEDUP_SCHEMA)
    assert _mask(family.process(state, batch)) == [True, False, False, True, True, False]
    assert list(family.finish(state)) == []
    m = family.metrics
    assert (m["numRowsDroppedByWatermark"], m["numDroppedDuplicateRows"],
            m["numUpdatedStateRows"], m["numRemovedStateRows"]) == (1, 2, 3, 2)
    assert len(state) == 1   # ("c", 20 s) outlives the eviction watermark of 12 s


def test_dedup_within_watermark_expires_at_event_time_plus_delay():
    schema = pa.schema([("c0", pa.string()), ("c1", TS)])
    family, state = task(Deduplicate, {
        "keyCount": 1, "eventTimeIndex": 1, "evictByKey": False, "withinWatermark": True,
        "delayMs": 10000, "evictionWatermarkMs": 15000}, schema)
    batch = pa.RecordBatch.from_arrays([pa.array(["a", "b", "a"]), _seconds(1, 8, 2)],
                                       schema=schema)
    assert _mask(family.process(state, batch)) == [True, True, False]
    family.finish(state)
    # a expires at 11 s (evicted by 15 s), b at 18 s (kept)
    assert family.metrics["numRemovedStateRows"] == 1 and len(state) == 1


def test_dedup_index_is_rebuilt_from_loaded_rows():
    family, state = _dedup()
    batch = pa.RecordBatch.from_arrays([pa.array(["a", "b"]), _seconds(1, 100)],
                                       schema=DEDUP_SCHEMA)
    family.process(state, batch)
    family.finish(state)
    state.index = type(state.index)()   # as after a load
    fresh, _ = _dedup(evictionWatermarkMs=50000)
    fresh.rebuild_index(state)
    fresh.finish(state)
    assert fresh.metrics["numRemovedStateRows"] == 1 and len(state) == 1


AGG_SCHEMA = pa.schema([("c0", pa.string()), ("c1", TS), ("c2", pa.int64())])


def _agg(mode, **operator):
    return task(Aggregate, {"keyCount": 2, "outputMode": mode, "eventTimeIndex": 1,
                             "batchSize": 2, **operator}, AGG_SCHEMA)


def _agg_batch(users, seconds, counts):
    return pa.RecordBatch.from_arrays([pa.array(users), _seconds(*seconds), pa.array(counts)],
                                      schema=AGG_SCHEMA)


def test_aggregate_lookup_returns_stored_buffers_by_position():
    family, state = _agg("update")
    assert family.process(state, _agg_batch(["a", "b"], [1, 2], [3, 4])) is None
    commit(state, 1)
    answer = family.lookup(state, pa.RecordBatch.from_arrays(
        [pa.array(["x", "b", "a"]), _seconds(1, 2, 1)], names=["c0", "c1"]))
    assert answer.column(0).to_pylist() == [1, 2] and answer.column(1).to_pylist() == [4, 3]


def test_aggregate_update_mode_masks_late_rows_and_evicts_without_output():
    family, state = _agg("update", lateEventsWatermarkMs=5000, evictionWatermarkMs=5000)
    family.lookup(state, _agg_batch(["a", "b", "c"], [1, 10, 20], [1, 1, 1]).select([0, 1]))
    answer = family.process(state, _agg_batch(["a", "b", "c"], [1, 10, 20], [1, 1, 1]))
    assert _mask(answer) == [False, True, True]
    assert list(family.finish(state)) == []
    assert family.metrics["numRowsDroppedByWatermark"] == 1 and len(state) == 2


def test_aggregate_append_mode_emits_closed_groups_in_batches():
    family, state = _agg("append", evictionWatermarkMs=15000)
    rows = _agg_batch(["a", "b", "c", "d"], [1, 5, 10, 20], [1, 2, 3, 4])
    family.lookup(state, rows.select([0, 1]))
    family.process(state, rows)
    out = list(family.finish(state))
    assert [b.num_rows for b in out] == [2, 1]
    assert sorted(v for b in out for v in b.column(2).to_pylist()) == [1, 2, 3]
    assert family.metrics["numRemovedStateRows"] == 3 and len(state) == 1


def test_aggregate_complete_mode_emits_every_group():
    family, state = _agg("complete", evictionWatermarkMs=15000)
    family.process(state, _agg_batch(["a", "b", "c"], [1, 5, 10], [1, 2, 3]))
    out = pa.Table.from_batches(list(family.finish(state)))
    assert sorted(out.column(2).to_pylist()) == [1, 2, 3]
    assert family.metrics["numRemovedStateRows"] == 0


def running_count(key, pdfs, state):
    n = state.get[0] if state.exists else 0
    for pdf in pdfs:
        n += len(pdf)
    if n >= 3:
        state.remove()
    else:
        state.update((n,))
    yield pd.DataFrame({"user": [key[0]], "count": [n]})


def _flatmap(func, **operator_extra):
    schema = pa.schema([("user", pa.string()), ("v", pa.int64())])
    command = base64.b64encode(CloudPickleSerializer().dumps((func, None))).decode()
    operator = {
        "command": command, "pythonIncludes": [], "keyIndices": [0], "valueCount": 2,
        "timeoutConf": "NoTimeout", "batchTimestampMs": 0, "eventTimeWatermarkMs": -1,
        "watermarkPresent": False, "runnerConf": {"spark.sql.session.timeZone": "UTC"},
        "stateSchema": '{"type":"struct","fields":[{"name":"count","type":"long",'
                       '"nullable":true,"metadata":{}}]}',
        "outputSchema": '{"type":"struct","fields":[{"name":"user","type":"string",'
                        '"nullable":true,"metadata":{}},{"name":"count","type":"long",'
                        '"nullable":true,"metadata":{}}]}', **operator_extra}
    return task(FlatMapGroupsWithState, operator, schema), schema


def test_flatmap_runs_the_function_per_group_and_keeps_or_removes_state():
    (family, state), schema = _flatmap(running_count)

    def run(users):
        out = family.process(state, pa.RecordBatch.from_arrays(
            [pa.array(users), pa.array(np.arange(len(users)))], schema=schema))
        rows = ([] if out is None else out.to_pylist()) + [
            r for b in family.finish(state) for r in b.to_pylist()]
        return sorted((r["user"], r["count"]) for r in rows)

    assert run(["a", "a", "b"]) == [("a", 2), ("b", 1)]
    assert len(state) == 2
    commit(state, 1)
    (family, _), _ = _flatmap(running_count)   # a new task on the same state
    assert run(["a", "b"]) == [("a", 3), ("b", 2)]
    assert len(state) == 1 and family.metrics["numRemovedStateRows"] == 1


def test_flatmap_reads_a_group_states_outcome_as_its_json_reports_it():
    from pyspark.sql.types import LongType, Row, StructField, StructType

    from arrowstate.families.flatmap import group_state_class

    def fresh(conf):
        return group_state_class()(
            optionalValue=Row(1), batchProcessingTimeMs=1_000, eventTimeWatermarkMs=500,
            timeoutConf=conf, hasTimedOut=False, watermarkPresent=True, defined=True,
            updated=False, removed=False, timeoutTimestamp=-1, keyAsUnsafe=None,
            valueSchema=StructType([StructField("n", LongType())]))

    actions = {
        "nothing": ("NoTimeout", lambda s: None),
        "update": ("NoTimeout", lambda s: s.update((2,))),
        "remove": ("NoTimeout", lambda s: s.remove()),
        "update then remove": ("NoTimeout", lambda s: (s.update((2,)), s.remove())),
        "duration": ("ProcessingTimeTimeout", lambda s: s.setTimeoutDuration(5_000)),
        "remove, duration": ("ProcessingTimeTimeout",
                             lambda s: (s.remove(), s.setTimeoutDuration(5_000))),
        "timestamp": ("EventTimeTimeout", lambda s: s.setTimeoutTimestamp(9_000)),
    }
    for name, (conf, act) in actions.items():
        state = fresh(conf)
        act(state)
        reported = json.loads(state.json())
        assert state.outcome() == (reported["updated"], reported["removed"],
                                   reported["timeoutTimestamp"]), name

    class OtherGroupState:   # a pyspark whose GroupState keeps its outcome elsewhere
        def json(self):
            return json.dumps({"updated": True, "removed": False, "timeoutTimestamp": 7})

    assert group_state_class().outcome(OtherGroupState()) == (True, False, 7)


def test_flatmap_group_state_updates_as_pysparks_does():
    import datetime
    import decimal

    from pyspark.errors import PySparkTypeError
    from pyspark.sql.streaming.state import GroupState
    from pyspark.sql.types import LongType, Row, StructField, StructType

    from arrowstate.families.flatmap import group_state_class

    def fresh(cls):
        return cls(optionalValue=None, batchProcessingTimeMs=0, eventTimeWatermarkMs=-1,
                   timeoutConf="NoTimeout", hasTimedOut=False, watermarkPresent=False,
                   defined=False, updated=False, removed=True, timeoutTimestamp=-1,
                   keyAsUnsafe=None, valueSchema=StructType([StructField("n", LongType())]))

    ours = group_state_class()
    assert issubclass(ours, GroupState)
    values = [(1,), [2, "b"], (np.int64(3), np.float32(1.5), np.bool_(True), np.str_("s")),
              (pd.Timestamp("2026-01-02 03:04:05.000006"), pd.Timedelta(seconds=90)),
              (pd.Timestamp("2026-01-02", tz="Europe/Berlin"), np.datetime64("2026-01-02")),
              (None, 1.5, True, b"x", decimal.Decimal("1.25"), datetime.date(2026, 1, 2),
               [1, 2], {"a": 1}, Row(x=1)), (np.float64("nan"), -0.0)]
    for value in values:
        theirs, mine = fresh(GroupState), fresh(ours)
        theirs.update(value)
        mine.update(value)
        assert mine.__dict__ == theirs.__dict__ or repr(mine.__dict__) == repr(theirs.__dict__)
        assert [type(v) for v in mine.get] == [type(v) for v in theirs.get], value
        assert mine.json() == theirs.json()
    for bad in (None, 5):
        errors = []
        for cls in (GroupState, ours):
            with pytest.raises((PySparkTypeError, TypeError)) as caught:
                fresh(cls).update(bad)
            errors.append((type(caught.value), str(caught.value)))
        assert errors[0] == errors[1]


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_family_metrics_are_declared_in_the_contract(name):
    declared = contract.python_metrics(name)
    family = {"deduplicate": lambda: _dedup()[0], "aggregate": lambda: _agg("update")[0],
              "flatMapGroupsWithState": lambda: _flatmap(running_count)[0][0],
              "sessionWindow": lambda: session_task("append")[0],
              "transformWithState": lambda: tws_task()[0][0]}[name]()
    assert set(family.metrics) <= declared


def test_transform_with_state_keeps_every_kind_of_variable_across_tasks_and_reloads():
    (family, state), schema = tws_task()

    def run(family, users, values):
        out = family.process(state, pa.RecordBatch.from_arrays(
            [pa.array(users), pa.array(users), pa.array(values)], schema=schema))
        rows = ([] if out is None else out.to_pylist()) + [
            r for b in family.finish(state) for r in b.to_pylist()]
        return sorted(tuple(r.values()) for r in rows)

    assert run(family, ["a", "a", "b"], [1, 1, 2]) == [
        ("a", 2, "[(1,), (1,)]", "[(('1',), (2,))]"), ("b", 1, "[(2,)]", "[(('2',), (1,))]")]
    # count + list + one map entry per key: Spark's numRowsTotal; each operation an update
    assert family.metrics["numTotalStateRows"] == 6
    assert family.metrics["numUpdatedStateRows"] == 8
    assert family.metrics["numValueStateVars"] == 1 and family.metrics["numMapStateVars"] == 1
    commit(state, 1)
    (family, _), _ = tws_task()   # the next task, on the state kept in memory
    assert run(family, ["a", "a"], [3, 1]) == [
        ("a", 4, "[]", "[(('1',), (3,)), (('3',), (1,))]")]
    assert family.metrics["numRemovedStateRows"] == 4   # the cleared list's values
    assert family.metrics["numTotalStateRows"] == 6     # a: count + 2 entries; b: 3
    commit(state, 2)
    state.objects = None   # as after a load from files: the values come back from Arrow
    (family, _), _ = tws_task()
    assert run(family, ["b"], [2]) == [("b", 2, "[(2,), (2,)]", "[(('2',), (2,))]")]
    assert family.metrics["numTotalStateRows"] == 6


def test_transform_with_state_calls_a_key_once_when_its_rows_span_batches():
    (family, state), schema = tws_task()
    outputs = []
    for users, values in ((["a", "b", "b"], [1, 2, 2]), (["b", "c"], [2, 3])):
        out = family.process(state, pa.RecordBatch.from_arrays(
            [pa.array(users), pa.array(users), pa.array(values)], schema=schema))
        outputs += [] if out is None else out.to_pylist()
    outputs += [r for b in family.finish(state) for r in b.to_pylist()]
    assert sorted((r["user"], r["count"]) for r in outputs) == [("a", 1), ("b", 3), ("c", 1)]


def test_sorted_by_key_orders_as_sparks_sort_stably_nulls_first_in_batches():
    batch = pa.record_batch([pa.array(["b", None, "a", "b", None, "ab"]), pa.array(range(6)),
                             pa.array([2, 1, 1, 2, 1, 1])], names=["k", "v", "k"])
    out = sorted_by_key([batch, batch.slice(0, 3)], [0, 2], 4)
    assert [len(b) for b in out] == [4, 4, 1]
    rows = [(k, v) for b in out for k, v in zip(b.column(0).to_pylist(),
                                                b.column(1).to_pylist())]
    # (key, key2) ascending, nulls first; rows of one key in the order they came
    assert rows == [(None, 1), (None, 4), (None, 1), ("a", 2), ("a", 2), ("ab", 5),
                    ("b", 0), ("b", 3), ("b", 0)]
    assert sorted_by_key([], [0], 10) == []


def test_a_real_time_flush_is_grouped_by_key_in_the_order_rows_came():
    batch = pa.record_batch([pa.array(["b", None, "a", "b", None, "ab", "b"]),
                             pa.array(range(7)), pa.array([2, 1, 1, 2, 1, 1, 3])],
                            names=["k", "v", "k"])
    out = grouped_by_key(batch, [0, 2], 3)
    assert [len(b) for b in out] == [3, 3, 1]
    rows = [(k, k2, v) for b in out for k, v, k2 in zip(*(c.to_pylist() for c in b.columns))]
    # keys in the order their first rows came, each key's rows together in their order
    assert rows == [("b", 2, 0), ("b", 2, 3), (None, 1, 1), (None, 1, 4), ("a", 1, 2),
                    ("ab", 1, 5), ("b", 3, 6)]
    distinct = batch.slice(0, 3)   # the usual flush: distinct keys, as they came
    assert grouped_by_key(distinct, [0], 10)[0] is distinct
    one, empty = batch.slice(0, 1), batch.slice(0, 0)
    assert grouped_by_key(one, [0], 10) == [one] and grouped_by_key(empty, [0], 10) == [empty]


@pytest.mark.parametrize("sorted_input", [True, False])
def test_function_families_group_rows_the_jvm_did_not_sort(sorted_input):
    """inputSorted false: rows of a key come in any order over several batches; the worker
    sorts the task's rows at its end and calls each key once with all of them."""
    users = [["b", "a", None, "b"], ["c", "a", "b"], [None, "a"]]
    if sorted_input:   # what the JVM's sort would send
        flat = sorted((u for batch in users for u in batch), key=lambda u: (u is not None, u))
        users = [flat[:4], flat[4:7], flat[7:]]
    extra = {"inputSorted": sorted_input, "maxRecordsPerBatch": 2}
    (family, state), schema = tws_task(**extra)
    outputs = []
    for batch in users:
        out = family.process(state, pa.RecordBatch.from_arrays(
            [pa.array(batch), pa.array(batch), pa.array([1] * len(batch))], schema=schema))
        outputs += [] if out is None else out.to_pylist()
    outputs += [r for b in family.finish(state) for r in b.to_pylist()]
    assert sorted(((r["user"] or ""), r["count"]) for r in outputs) == [
        ("", 2), ("a", 3), ("b", 3), ("c", 1)]

    (family, state), schema = _flatmap(running_count, **extra)
    outputs = []
    for batch in users:
        out = family.process(state, pa.RecordBatch.from_arrays(
            [pa.array(batch), pa.array([1] * len(batch))], schema=schema))
        outputs += [] if out is None else out.to_pylist()
    outputs += [r for b in family.finish(state) for r in b.to_pylist()]
    assert sorted(((r["user"] or ""), r["count"]) for r in outputs) == [
        ("", 2), ("a", 3), ("b", 3), ("c", 1)]


class _Alarms(StatefulProcessor):
    """Sets a timer at each value (ms); value 0 deletes the key's timers; a fired timer is
    reported with the timers the key still has."""

    def init(self, handle):
        self.handle = handle

    def handleInputRows(self, key, rows, timerValues):
        for pdf in rows:
            for v in pdf["v"].tolist():
                if v == 0:
                    for t in list(self.handle.listTimers()):
                        self.handle.deleteTimer(t)
                else:
                    self.handle.registerTimer(v)
        return iter(())

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        yield pd.DataFrame({"user": [key.user], "count": [expiredTimerInfo.getExpiryTimeInMs()],
                            "values": [str(list(self.handle.listTimers()))],
                            "per_value": [str(timerValues.getCurrentWatermarkInMs())]})


def test_transform_with_state_timers_expire_in_time_order_across_tasks_and_reloads():
    def task(watermark, state=None):
        (family, fresh), schema = tws_task(_Alarms(), "EventTime", evictionWatermarkMs=watermark,
                                        batchTimestampMs=5)
        return family, (fresh if state is None else state), schema

    def run(family, state, schema, users, values):
        out = family.process(state, pa.RecordBatch.from_arrays(
            [pa.array(users), pa.array(users), pa.array(values)], schema=schema))
        rows = ([] if out is None else out.to_pylist()) + [
            r for b in family.finish(state) for r in b.to_pylist()]
        return [(r["user"], r["count"], r["values"], r["per_value"]) for r in rows]

    family, state, schema = task(10)
    # b's timer at 10 is due now: it fires after the rows, with the key as a Row
    assert run(family, state, schema, ["a", "a", "b", "b"], [30, 20, 10, 40]) == [
        ("b", 10, "[10, 40]", "10")]
    assert family.metrics["numRegisteredTimers"] == 4
    assert family.metrics["numDeletedTimers"] == 1      # the fired timer's deletion
    assert family.metrics["numTotalStateRows"] == 0     # timers are not state rows
    commit(state, 1)
    family, _, _ = task(35, state)
    # a's 0 deletes its timers; c's 25 and b's 30... fire in time order
    assert run(family, state, schema, ["a", "c", "c"], [0, 25, 30]) == [
        ("c", 25, "[25, 30]", "35"), ("c", 30, "[30]", "35")]
    commit(state, 2)
    state.objects = None   # as after a load from files: timers come back from Arrow
    family, _, _ = task(100, state)
    assert run(family, state, schema, [], []) == [("b", 40, "[40]", "100")]
    assert len(state) == 0


def test_transform_with_state_change_feed_has_a_record_per_state_operation():
    """What the family's deltas give Spark's change feed (spark_state.readers): every operation of a
    task in order (repeated writes of a key too), a single value write from its put row."""
    import json

    from arrowstate.spark_state import readers

    (family, state), schema = tws_task()
    written = {}

    class Files:
        where, context = "ck/state/0/0", "operator 0, partition 0"

        def names(self):
            return list(written)

        def read(self, name):
            return written[name]

    def run(version, users, values):
        family, _ = tws_task()[0]
        family.process(state, pa.RecordBatch.from_arrays(
            [pa.array(users), pa.array(users), pa.array(values)], schema=schema))
        list(family.finish(state))
        written.update(state.commit_files(version, 100).written())
        state.mark_committed(version, 1000)

    run(1, ["a", "a", "b"], [1, 1, 2])
    run(2, ["a", "a"], [3, 1])
    run(3, ["b", "b"], [5, 6])   # appended to a stored list: the records hold the new ones

    def struct(**fields):
        return {"type": "struct", "fields": [{"name": n, "type": t, "nullable": True,
                                              "metadata": {}} for n, t in fields.items()]}

    user, n = struct(user="string"), struct(n="long")

    def feed(variable, key):
        batches = readers.read_column_family_changes(
            Files(), 1, 3, variable, json.dumps(key), json.dumps(n))
        return [(r["version"], r["op"], r["key"], r["value"])
                for b in batches for r in b.to_pylist()]

    put, merge, delete = readers.FEED_PUT, readers.FEED_MERGE, readers.FEED_DELETE
    a, b = {"user": "a"}, {"user": "b"}
    assert sorted(feed("count", user), key=str) == sorted([
        (1, put, a, {"n": 2}), (1, put, b, {"n": 1}), (2, put, a, {"n": 4}),
        (3, put, b, {"n": 3})], key=str)
    assert feed("values", user) == [
        (1, merge, a, {"n": 1}), (1, merge, a, {"n": 1}), (1, merge, b, {"n": 2}),
        (2, merge, a, {"n": 3}), (2, merge, a, {"n": 1}), (2, delete, a, None),
        (3, merge, b, {"n": 5}), (3, merge, b, {"n": 6})]
    entry = struct(key=user, userKey=struct(v="string"))
    assert feed("per_value", entry) == [
        (1, put, {"key": a, "userKey": {"v": "1"}}, {"n": 1}),
        (1, put, {"key": a, "userKey": {"v": "1"}}, {"n": 2}),
        (1, put, {"key": b, "userKey": {"v": "2"}}, {"n": 1}),
        (2, put, {"key": a, "userKey": {"v": "3"}}, {"n": 1}),
        (2, put, {"key": a, "userKey": {"v": "1"}}, {"n": 3}),
        (3, put, {"key": b, "userKey": {"v": "5"}}, {"n": 1}),
        (3, put, {"key": b, "userKey": {"v": "6"}}, {"n": 1})]
