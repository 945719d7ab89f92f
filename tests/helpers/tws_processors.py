"""transformWithState processors for tests (pickled by value, so workers need not import
this module)."""
import pandas as pd
from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import StatefulProcessor
from pyspark.sql.types import LongType, StructField, StructType


class RunningCount(StatefulProcessor):
    """transformWithStateInPandas: a running count per key in a ValueState."""

    def init(self, handle):
        self.count = handle.getValueState("count", StructType([StructField("n", LongType())]))

    def handleInputRows(self, key, rows, timerValues):
        n = self.count.get()[0] if self.count.exists() else 0
        for pdf in rows:
            n += len(pdf)
        self.count.update((n,))
        yield pd.DataFrame({"user": [key[0]], "count": [n]})


class EveryVariable(StatefulProcessor):
    """A value, a list and a map per key, written with every operation (a value twice, a
    list appended one value or several at a time and put, a map's entries updated, an
    absent one removed, the map cleared at three rows); at four rows all three are cleared
    or trimmed. Reports what the state holds, so a value that comes back wrong shows."""

    def init(self, handle):
        self.count = handle.getValueState("count", "n long")
        self.items = handle.getListState("items", "v long, at timestamp")
        self.seen = handle.getMapState("seen", "k string", "c long, last double")

    def _update(self, user, values, stamps):
        n = self.count.get()[0] if self.count.exists() else 0
        n += len(values)
        self.count.update((-n,))   # written twice in a call: two records in a change feed
        if len(values) > 1:
            self.items.appendList(list(zip(values, stamps)))
        for v, at in zip(values, stamps):
            if len(values) == 1:
                self.items.appendValue((v, at))
            c = self.seen.getValue((str(v),))
            self.seen.updateValue((str(v),), ((c[0] if c else 0) + 1, v / 2))
        self.seen.removeKey(("absent",))   # Spark records the removal all the same
        if n == 3:
            self.seen.clear()
        if n >= 4:
            self.count.clear()
            self.items.clear()
            self.seen.removeKey(("1",))
        else:
            self.count.update((n,))
            if n == 3:
                self.items.put([(n, None)])
        listed = sorted(self.items.get(), key=repr)
        entries = sorted(self.seen.iterator(), key=repr)
        return (user, n, repr(listed), repr(entries), self.items.exists(), self.seen.exists(),
                self.seen.containsKey(("2",)))

    def handleInputRows(self, key, rows, timerValues):
        values, stamps = [], []
        for pdf in rows:
            values += pdf["v"].tolist()
            stamps += list(pdf["ts"])
        user, n, listed, entries, has_items, has_seen, has_two = self._update(
            key[0], values, stamps)
        yield pd.DataFrame({"user": [user], "count": [n], "items": [listed],
                            "entries": [entries], "has_items": [has_items],
                            "has_seen": [has_seen], "has_two": [has_two]})


EVERY_VARIABLE_OUTPUT = ("user string, count long, items string, entries string, "
                         "has_items boolean, has_seen boolean, has_two boolean")


class SessionTimeout(StatefulProcessor):
    """EventTime: a count per key that times out 5 s of event time after the key's latest
    row (the earlier timer deleted, the new one registered); a first row also registers a
    timer long past, which fires in the same batch. Expiry reports and clears the key."""

    def init(self, handle):
        self.handle = handle
        self.count = handle.getValueState("count", "n long")

    def _seen(self, key, n, latest_ms, timer_values):
        before = self.count.get()[0] if self.count.exists() else 0
        for old in list(self.handle.listTimers()):
            if old > 1000:
                self.handle.deleteTimer(old)
        if before == 0:
            self.handle.registerTimer(1000)
        self.handle.registerTimer(latest_ms + 5000)
        self.count.update((before + n,))
        return (key[0], before + n, f"rows at watermark {timer_values.getCurrentWatermarkInMs()}"
                f", timers {sorted(self.handle.listTimers())}")

    def _expired(self, key, timer_values, info):
        n = self.count.get()[0] if self.count.exists() else 0
        if info.getExpiryTimeInMs() > 1000:
            self.count.clear()
        return (key[0], n, f"timer {info.getExpiryTimeInMs()} expired at watermark "
                f"{timer_values.getCurrentWatermarkInMs()}, key {key!r}, timers "
                f"{sorted(self.handle.listTimers())}")

    def handleInputRows(self, key, rows, timerValues):
        n, latest = 0, None
        for pdf in rows:
            n += len(pdf)
            top = pdf["ts"].max()
            latest = top if latest is None or top > latest else latest
        user, count, what = self._seen(key, n, int(latest.timestamp() * 1000), timerValues)
        yield pd.DataFrame({"user": [user], "count": [count], "what": [what]})

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        user, count, what = self._expired(key, timerValues, expiredTimerInfo)
        yield pd.DataFrame({"user": [user], "count": [count], "what": [what]})


class SessionTimeoutRows(SessionTimeout):
    """SessionTimeout through the Row API."""

    def handleInputRows(self, key, rows, timerValues):
        stamps = [row.ts for row in rows]
        yield self._row(self._seen(key, len(stamps), int(max(stamps).timestamp() * 1000),
                                   timerValues))

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        yield self._row(self._expired(key, timerValues, expiredTimerInfo))

    @staticmethod
    def _row(values):
        user, count, what = values
        return Row(user=user, count=count, what=what)


SESSION_OUTPUT = "user string, count long, what string"


class TimersWithTTL(StatefulProcessor):
    """ProcessingTime, Row API: per key a count, a list and a map kept an hour (TTL), a list
    and a map without TTL, and a timer an hour after each batch of the key's rows (none
    fires in a test): every kind of state together, for the state tools. Reports counts
    only (the clock's times differ between runs)."""

    def init(self, handle):
        hour = 3_600_000
        self.handle = handle
        self.count = handle.getValueState("count", "n long", hour)
        self.recent = handle.getListState("recent", "n long", hour)
        self.by_size = handle.getMapState("by_size", "n long", "total long", hour)
        self.sizes = handle.getListState("sizes", "n long, at timestamp")
        self.seen = handle.getMapState("seen", "v long", "c long, last double")

    def handleInputRows(self, key, rows, timerValues):
        rows = list(rows)
        n = len(rows)
        total = (self.count.get()[0] if self.count.exists() else 0) + n
        self.count.update((total,))
        self.recent.appendValue((n,))
        self.by_size.updateValue((n,), (total,))
        self.sizes.appendValue((n, max(row.ts for row in rows)))
        for row in rows:
            c = self.seen.getValue((row.v,))
            self.seen.updateValue((row.v,), ((c[0] if c else 0) + 1, row.v / 2))
        if total >= 5:   # removals and a list cut short, as the state tools must carry them
            self.seen.removeKey((1,))
            self.sizes.put([(total, None)])
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 3_600_000)
        yield Row(user=key[0], count=total,
                  what=f"{len(list(self.handle.listTimers()))} timers")

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        yield Row(user=key[0], count=-1, what="timer fired")


class ProcessingTimeTimers(StatefulProcessor):
    """ProcessingTime: each key's rows register a timer due now (it fires after the batch's
    rows) and one 1 ms from now (it fires in the key's next batch); what is reported does
    not depend on the clock."""

    def init(self, handle):
        self.handle = handle
        self.fired = handle.getValueState("fired", "n long")

    def _register_timers(self, timer_values):
        now = timer_values.getCurrentProcessingTimeInMs()
        self.handle.registerTimer(now)
        self.handle.registerTimer(now + 1)

    def handleInputRows(self, key, rows, timerValues):
        n = sum(len(pdf) for pdf in rows)
        self._register_timers(timerValues)
        yield pd.DataFrame({"user": [key[0]], "count": [n],
                            "what": [f"rows, {len(list(self.handle.listTimers()))} timers"]})

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        fired = (self.fired.get()[0] if self.fired.exists() else 0) + 1
        self.fired.update((fired,))
        due = expiredTimerInfo.getExpiryTimeInMs() <= timerValues.getCurrentProcessingTimeInMs()
        yield pd.DataFrame({"user": [key[0]], "count": [fired],
                            "what": [f"timer fired, due {due}"]})


class EveryVariableWithTTL(StatefulProcessor):
    """ProcessingTime with TTLs: a count kept an hour (updated twice per call: Spark counts
    an unchanged TTL write once), and a value, a list and a map kept 1 ms, so what one batch
    writes has expired by the key's next batch: reads skip it and the batch's end removes
    it. Reports what each read sees."""

    def init(self, handle):
        self.count = handle.getValueState("count", "n long", 3_600_000)
        self.last = handle.getValueState("last", "v long", 1)
        self.items = handle.getListState("items", "v long", 1)
        self.seen = handle.getMapState("seen", "k string", "c long", 1)

    def handleInputRows(self, key, rows, timerValues):
        values = [v for pdf in rows for v in pdf["v"].tolist()]
        n = (self.count.get()[0] if self.count.exists() else 0) + len(values)
        self.count.update((n,))
        self.count.update((n,))
        before = (self.last.exists(), self.items.exists(), sorted(self.items.get()),
                  self.seen.exists(), sorted(self.seen.iterator()))
        self.last.update((values[-1],))
        self.items.appendList([(v,) for v in values])
        if len(values) > 1:
            self.items.put([(values[0],)])
        for v in values:
            self.seen.updateValue((str(v),), (v,))
        after = (self.last.get(), sorted(self.items.get()), sorted(self.seen.iterator()))
        if n >= 4:
            self.seen.clear()
            self.last.clear()
        yield pd.DataFrame({"user": [key[0]], "count": [n], "what": [repr((before, after))]})


class EveryVariableWithTTLAndTimers(EveryVariableWithTTL):
    """EveryVariableWithTTL with ProcessingTimeTimers' timers: state expiring by TTL and
    timers firing in one processor (what reads each batch does not depend on the clock)."""

    def init(self, handle):
        super().init(handle)
        ProcessingTimeTimers.init(self, handle)

    def handleInputRows(self, key, rows, timerValues):
        ProcessingTimeTimers._register_timers(self, timerValues)
        yield from super().handleInputRows(key, rows, timerValues)

    handleExpiredTimer = ProcessingTimeTimers.handleExpiredTimer


class SeededCount(StatefulProcessor):
    """RunningCount seeded from an initial state (columns user, n: a key's rows add up);
    the Row API twin takes one Row per call."""

    def __init__(self, rows_api=False):
        self.rows_api = rows_api

    def init(self, handle):
        self.count = handle.getValueState("count", "n long")

    def handleInitialState(self, key, initialState, timerValues):
        seeded = initialState.n if self.rows_api else int(initialState["n"].sum())
        before = self.count.get()[0] if self.count.exists() else 0
        self.count.update((before + seeded,))

    def handleInputRows(self, key, rows, timerValues):
        n = self.count.get()[0] if self.count.exists() else 0
        n += sum(1 for _ in rows) if self.rows_api else sum(len(pdf) for pdf in rows)
        self.count.update((n,))
        if self.rows_api:
            yield Row(user=key[0], count=n)
        else:
            yield pd.DataFrame({"user": [key[0]], "count": [n]})


class RunningCountWithHistory(RunningCount):
    """RunningCount plus a list state added later in the query's life: a processor that
    gained a variable between runs (Spark allows adding state variables)."""

    def init(self, handle):
        super().init(handle)
        self.history = handle.getListState("history", "n long")

    def handleInputRows(self, key, rows, timerValues):
        for pdf in super().handleInputRows(key, rows, timerValues):
            self.history.appendValue((int(pdf["count"][0]),))
            pdf["count"] = pdf["count"] * 1000 + len(list(self.history.get()))
            yield pdf


class RunningCountDroppingHistory(RunningCount):
    """RunningCount that deletes, in init(), the list state an earlier run declared
    (RunningCountWithHistory's) without declaring it: Spark removes its column family."""

    def init(self, handle):
        super().init(handle)
        handle.deleteIfExists("history")


class LongList(StatefulProcessor):
    """Appends `size` values to one list per key in each call: a working set (the key's
    decoded list) of about 100 bytes a value in the worker."""

    def __init__(self, size):
        self.size = size

    def init(self, handle):
        self.values = handle.getListState("values", "v long")

    def handleInputRows(self, key, rows, timerValues):
        self.values.appendList([(i,) for i in range(self.size)])
        yield pd.DataFrame({"user": [key[0]], "count": [self.size]})


class NotesWhereInitRuns(RunningCount):
    """A running count whose init() notes, in a file of `directory`, the command line of
    the process it runs in and of that process's parent, and whether it is Spark's planning
    on the driver (pyspark's pre-init, whose client is in state PRE_INIT); with `fail`,
    that init() raises the user's error."""

    def __init__(self, directory, fail=False):
        self.directory, self.fail = directory, fail

    def init(self, handle):
        import os
        import uuid

        def command_line(pid):
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read().replace(b"\0", b" ").decode()

        from pyspark.sql.streaming.stateful_processor_api_client import (
            StatefulProcessorHandleState)

        client = getattr(handle, "_statefulProcessorApiClient", None)
        driver = getattr(client, "handle_state", None) == StatefulProcessorHandleState.PRE_INIT
        with open(os.path.join(self.directory, uuid.uuid4().hex), "w") as f:
            f.write("\n".join([str(driver), command_line(os.getpid()),
                               command_line(os.getppid())]))
        if driver and self.fail:
            raise ValueError("init() refuses to plan this query")
        super().init(handle)


class CountPerKey(StatefulProcessor):
    """Row API: rows per key so far, for keys of any type (given back as text)."""

    def init(self, handle):
        self.count = handle.getValueState("count", "n long")

    def handleInputRows(self, key, rows, timerValues):
        n = (self.count.get()[0] if self.count.exists() else 0) + sum(1 for _ in rows)
        self.count.update((n,))
        yield Row(key=None if key[0] is None else str(key[0]), count=n)
