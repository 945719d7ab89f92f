"""Stateful processors for the timer, TTL and initial-state scenarios of Spark's own PySpark
transformWithState tests (python/pyspark/sql/tests/pandas/streaming/
test_pandas_transform_with_state.py, test_pandas_transform_with_state_state_variable.py and
their helper module), written afresh for the differential harness (tests/helpers/harness.py); the
time mode None scenarios are in tws_spark_processors.py, whose helpers these build on.

As there, where Spark's processors assert inside the worker these report what they saw in
their output rows. Spark's processors also put wall-clock values in their output (processing
times, timers set from them); these report relations instead ("the timer was due", "two
timers were listed"), so that the run on Spark and the run on arrowstate compare equal.

Every processor serves both APIs: `pandas=True` for transformWithStateInPandas,
`pandas=False` for transformWithState. Pickled by value (the tests register this module and
tws_spark_processors), so workers need not import them.
"""
import pandas as pd
from pyspark.sql.types import StringType, StructField, StructType, TimestampType

from tws_spark_processors import (StateVariableTour, _BothApis, _int_field,
                                  _ListOperations, _MapOperations)

HOUR_MS = 60 * 60 * 1000        # a TTL that never passes within a test
YEAR_MS = 365 * 24 * HOUR_MS    # Spark's MapStateLargeTTLProcessor's
SHORT_MS = 1                    # a TTL that has passed by the key's next batch


def _text_field(name):
    return StructType([StructField(name, StringType(), True)])


class _TimedApis(_BothApis):
    """_BothApis, plus the event times of a key's rows in seconds."""

    def _seconds(self, rows, column="eventTime"):
        seconds = []
        for item in rows:
            if self.pandas:   # datetime64 as integers, at nanoseconds, as Spark's test does
                seconds += (item[column].astype("int64") // 10**9).tolist()
            else:
                seconds.append(int(item[column].timestamp()))
        return seconds


# --------------------------------------------------------------------------------------------
# test_transform_with_state_proc_timer (ProcTimeStatefulProcessor)

class ProcessingTimeCount(_BothApis):
    """A running row count per id in a value state (as a string). Key "0" registers a
    processing-time timer 1 ms after the batch's time in every batch; a timer that fires
    resets the count and reports "-1". Spark's processor outputs the batch's processing
    time (and the timer's) and its test checks that the timer fired before the batch's
    time; here the third column tells that relation, the timers listed for the key, and
    whether two listings of them agree (Spark's processor asserts there are two)."""

    OUTPUT = "id string, countAsString string, timeValues string"

    def init(self, handle):
        self.handle = handle
        self.count = handle.getValueState("count_state", _text_field("value"))

    def handleInputRows(self, key, rows, timerValues):
        count = int(self.count.get()[0]) if self.count.exists() else 0
        if key == ("0",):
            self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 1)
        count += sum(len(chunk) for chunk in self._chunks(rows, "temperature"))
        self.count.update((str(count),))
        listed = len(list(self.handle.listTimers()))
        yield from self._emit([{"id": key[0], "countAsString": str(count),
                                "timeValues": f"timers listed {listed}"}])

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        first = list(self.handle.listTimers())
        second = []
        for ts in self.handle.listTimers():   # a second iterator over the same key's timers
            second.append(ts)
        expiry = expiredTimerInfo.getExpiryTimeInMs()
        now = timerValues.getCurrentProcessingTimeInMs()
        self.count.clear()
        self.handle.deleteTimer(expiry)
        yield from self._emit([{
            "id": key[0], "countAsString": "-1",
            "timeValues": (f"fired before the batch's time {expiry < now}, timers listed "
                           f"{len(first)}, listings agree {first == second}, "
                           f"this one listed {expiry in first}")}])


# --------------------------------------------------------------------------------------------
# test_transform_with_state_event_time (EventTimeStatefulProcessor)

class MaxEventTime(_TimedApis):
    """The largest event time (seconds) seen per id, as a string in a value state; every
    batch registers an event-time timer at the current watermark, and a timer that fires
    clears the state and reports "<id>-expired" with the timer's time (event time: no
    wall clock in it)."""

    OUTPUT = "id string, timestamp string"

    def init(self, handle):
        self.handle = handle
        self.largest = handle.getValueState("max_state", _text_field("value"))

    def handleInputRows(self, key, rows, timerValues):
        current = int(self.largest.get()[0]) if self.largest.exists() else 0
        largest = str(max(current, max(self._seconds(rows))))
        self.largest.update((largest,))
        self.handle.registerTimer(timerValues.getCurrentWatermarkInMs())
        yield from self._emit([{"id": key[0], "timestamp": largest}])

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        self.largest.clear()
        self.handle.deleteTimer(expiredTimerInfo.getExpiryTimeInMs())
        yield from self._emit([{"id": f"{key[0]}-expired",
                                "timestamp": str(expiredTimerInfo.getExpiryTimeInMs())}])


# --------------------------------------------------------------------------------------------
# test_transform_with_state_chaining_ops (StatefulProcessorChainingOps)

class FirstEventTime(_BothApis):
    """No state: per id and batch one row with an event time of its rows, the output's
    event-time column (pandas API: the first of the key's last DataFrame, as Spark's
    processor takes it; Row API: the first row's)."""

    OUTPUT = "id string, outputTimestamp timestamp"

    def init(self, handle):
        """No state variables."""

    def handleInputRows(self, key, rows, timerValues):
        if self.pandas:
            for pdf in rows:
                stamps = pdf["eventTime"].tolist()
            yield pd.DataFrame({"id": [key[0]], "outputTimestamp": [stamps[0]]})
        else:
            stamps = [row.eventTime for row in rows]
            yield from self._emit([{"id": key[0], "outputTimestamp": stamps[0]}])


# --------------------------------------------------------------------------------------------
# test_value_state_ttl_basic (SimpleTTLStatefulProcessor),
# test_transform_with_state_list_state_large_ttl (ListStateLargeTTLProcessor),
# test_transform_with_state_map_state_large_ttl and
# test_transform_with_map_state_metadata_with_init_state (MapStateLargeTTLProcessor):
# the state variable tour's parts with TTLs that do not pass within the test

class _ViolationsWithTtl:
    """A running count of temperatures over 100 in a value state with a TTL (Spark:
    30 s; here an hour, so that a slow batch cannot let it pass), and a second value
    state deleted in init(), whose exists() must then raise."""

    columns = "violations int, previous int, scratch string"

    def init(self, handle):
        self.violations = handle.getValueState("numViolations", _int_field("value"), HOUR_MS)
        self.scratch = handle.getValueState("tempState", _int_field("value"))
        handle.deleteIfExists("tempState")

    def run(self, key, chunks):
        try:
            scratch = f"exists() answered {self.scratch.exists()}"
        except Exception as e:   # pyspark's PySparkRuntimeError, in both runs
            known = "Error checking value state exists" in str(e)
            scratch = f"exists() raised {type(e).__name__}, Spark's message: {known}"
        previous = self.violations.get()[0] if self.violations.exists() else None
        total = (previous or 0) + sum(1 for chunk in chunks for (t,) in chunk
                                      if t is not None and t > 100)
        self.violations.update((total,))
        return {"violations": total, "previous": previous, "scratch": scratch}


class _ListOperationsWithTtl(_ListOperations):
    """The list state tour (put, appendValue, appendList, interleaved iterators) on two
    lists with a TTL (Spark: 30 s; here an hour) and a timestamp list without."""

    def init(self, handle):
        element = _int_field("temperature")
        self.first = handle.getListState("listState1", element, HOUR_MS)
        self.second = handle.getListState("listState2", element, HOUR_MS)
        self.stamps = handle.getListState(
            "listStateTimestamp", StructType([StructField("time", TimestampType(), True)]))


class _MapOperationsWithTtl(_MapOperations):
    """The map state tour on a map whose schemas are StructTypes, with a TTL of a year,
    beside a list state the processor never writes. (Its removeKey and clear leave
    Spark's TTL index entries behind, which Spark counts as removed again once the TTL
    passes and arrowstate does not: a documented difference, which a TTL of a year keeps
    out of the test.)"""

    def init(self, handle):
        name = _text_field("name")
        self.entries = handle.getMapState("mapState", name, _int_field("count"), YEAR_MS)
        self.unused = handle.getListState("listState", name)


TTL_PARTS = [_ListOperationsWithTtl, _ViolationsWithTtl, _MapOperationsWithTtl]
TTL_TOUR_OUTPUT = ", ".join(["id string"] + [p.columns for p in TTL_PARTS])


class TtlTour(StateVariableTour):
    """StateVariableTour over the TTL parts: each in turn on the key's temperature chunks;
    one row per key."""

    OUTPUT = TTL_TOUR_OUTPUT

    def __init__(self, pandas=True):
        _BothApis.__init__(self, pandas)
        self.parts = [p() for p in TTL_PARTS]


# --------------------------------------------------------------------------------------------
# test_value_state_ttl_expiration (TTLStatefulProcessor)

class TtlExpiry(_BothApis):
    """Spark's processor, kept twice over: for each TTL ("1 ms", which has passed by the
    key's next batch, and "1 hour", which never passes here) a value, a list and a map
    state with that TTL, counting the key's rows; id "0" leaves them unwritten in the
    batch where its value count reaches 2, as Spark's does. Beside them a count without a
    TTL. Spark's test (skipped there as flaky) takes a TTL of 10 s with sleeps of 4 s
    between batches, so that what id 0 left unwritten has expired two batches later and
    what id 1 rewrote has not; here the 1 ms TTL shows the expiry and the 1 hour TTL the
    state that was kept. The map's user key is the grouping key; no removeKey (see
    _MapOperationsWithTtl)."""

    OUTPUT = "id string, count int, ttl string"
    TTLS = {"1 ms": SHORT_MS, "1 hour": HOUR_MS}

    def init(self, handle):
        value = _int_field("value")
        self.count = handle.getValueState("state", value)
        self.families = {}
        for label, ms in self.TTLS.items():
            suffix = label.replace(" ", "")
            self.families[label] = (
                handle.getValueState(f"ttl-state-{suffix}", value, ms),
                handle.getListState(f"ttl-list-state-{suffix}", value, ms),
                handle.getMapState(f"ttl-map-state-{suffix}", _text_field("id"), value, ms))

    def handleInputRows(self, key, rows, timerValues):
        name = key[0]
        n = sum(1 for chunk in self._chunks(rows, "temperature") for (t,) in chunk
                if t is not None)
        count = (self.count.get()[0] if self.count.exists() else 0) + n
        self.count.update((count,))
        records = [{"id": f"count-{name}", "count": count, "ttl": None}]
        for label, (value, items, entries) in self.families.items():
            value_count = (value.get()[0] if value.exists() else 0) + n
            list_count = (sum(v[0] for v in items.get()) if items.exists() else 0) + n
            map_count = (entries.getValue(key)[0] if entries.exists() else 0) + n
            if not (value_count == 2 and name == "0"):
                value.update((value_count,))
                items.put([(list_count,), (list_count,)])
                entries.updateValue(key, (map_count,))
            records += [{"id": f"ttl-count-{name}", "count": value_count, "ttl": label},
                        {"id": f"ttl-list-state-count-{name}", "count": list_count,
                         "ttl": label},
                        {"id": f"ttl-map-state-count-{name}", "count": map_count,
                         "ttl": label}]
        yield from self._emit(records)


# --------------------------------------------------------------------------------------------
# test_transform_with_state_init_state (SimpleStatefulProcessorWithInitialState),
# ..._init_state_with_timers (StatefulProcessorWithInitialStateTimers),
# ..._non_contiguous_grouping_cols_with_init_state,
# test_transform_with_state_with_records_limit / _bytes_limit with an initial state
# (ChunkCountProcessorWithInitialState), ..._batch_query_initial_state

class SeededSum(_BothApis):
    """A running sum of temperatures per grouping key (one or two columns) in a value
    state, seeded by handleInitialState with the initial state's initVal. Also reports how
    many DataFrames (pandas) or Rows the key's input came in, and the columns of what
    handleInitialState was handed in this task (None for a key it was not called for).
    With `timers`, handleInitialState registers a processing-time timer 1 ms before the
    batch's time, which fires in the same batch: "<id>-expired" with, in place of the
    timer's time, whether it was before the batch's time."""

    def __init__(self, pandas=True, timers=False):
        super().__init__(pandas)
        self.timers = timers

    @staticmethod
    def output(keys=("id",)):
        return ", ".join([f"{k} string" for k in keys]
                         + ["value string", "chunks int", "initColumns string"])

    def init(self, handle):
        self.handle = handle
        self.total = handle.getValueState("value_state", _int_field("value"))
        self.seen_initial = {}

    def _names(self, key):
        return ("id1", "id2") if len(key) > 1 else ("id",)

    def handleInitialState(self, key, initialState, timerValues):
        if self.pandas:
            value = initialState.at[0, "initVal"]
            columns = ",".join(initialState.columns)
        else:
            value = initialState.initVal
            columns = ",".join(initialState.__fields__)
        self.total.update((value,))
        self.seen_initial.setdefault(tuple(key), []).append(columns)
        if self.timers:
            self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() - 1)

    def handleInputRows(self, key, rows, timerValues):
        total = self.total.get()[0] if self.total.exists() else 0
        chunks = self._chunks(rows, "temperature")
        total += sum(t for chunk in chunks for (t,) in chunk)
        self.total.update((total,))
        record = dict(zip(self._names(key), key))
        seen = self.seen_initial.pop(tuple(key), None)
        record.update(value=str(total), chunks=len(chunks),
                      initColumns=None if seen is None else "|".join(seen))
        yield from self._emit([record])

    def close(self):
        self.seen_initial = {}   # a task's: the next batch's processor starts afresh

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        expiry = expiredTimerInfo.getExpiryTimeInMs()
        self.handle.deleteTimer(expiry)
        before = expiry < timerValues.getCurrentProcessingTimeInMs()
        yield from self._emit([{"id": f"{key[0]}-expired",
                                "value": f"fired before the batch's time {before}",
                                "chunks": None, "initColumns": None}])


# --------------------------------------------------------------------------------------------
# test_transform_with_state_restart_with_multiple_rows_init_state
# (StatefulProcessorWithListStateInitialState)

class SeededList(_BothApis):
    """SeededSum's running sum, never seeded: handleInitialState appends every initVal of
    the key's initial state (several rows per key) to a list state instead; the output
    also lists that list, sorted, and the sizes of the DataFrames (pandas; Rows: 1 each)
    the key's input and, in this task, its initial state came in."""

    OUTPUT = ("id string, value string, listed string, chunks string, "
              "initChunks string")

    def init(self, handle):
        self.total = handle.getValueState("value_state", _int_field("value"))
        self.items = handle.getListState("list_state", _int_field("value"))
        self.seen_initial = {}

    def handleInitialState(self, key, initialState, timerValues):
        values = (initialState["initVal"].tolist() if self.pandas
                  else [initialState.initVal])
        for v in values:
            self.items.appendValue((v,))
        self.seen_initial.setdefault(tuple(key), []).append(len(values))

    def handleInputRows(self, key, rows, timerValues):
        total = self.total.get()[0] if self.total.exists() else 0
        chunks = self._chunks(rows, "temperature")
        total += sum(t for chunk in chunks for (t,) in chunk)
        self.total.update((total,))
        listed = ",".join(str(v) for v in sorted(v[0] for v in self.items.get()))
        seen = self.seen_initial.pop(tuple(key), None)
        yield from self._emit([{"id": key[0], "value": str(total), "listed": listed,
                                "chunks": ",".join(str(len(c)) for c in chunks),
                                "initChunks": None if seen is None
                                else ",".join(map(str, seen))}])

    def close(self):
        self.seen_initial = {}
