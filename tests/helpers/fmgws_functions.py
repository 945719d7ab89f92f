"""State functions for the applyInPandasWithState tests (pickled by value into workers)."""
import datetime as dt
import decimal

import numpy as np
import pandas as pd


def running_count(key, pdfs, state):
    """Counts rows per key across batches; one output row per call."""
    n = state.get[0] if state.exists else 0
    for pdf in pdfs:
        n += len(pdf)
    state.update((n,))
    yield pd.DataFrame({"user": [key[0]], "count": [n]})


def session_with_processing_timeout(key, pdfs, state):
    """Emits a session's total when it times out; otherwise keeps the running total."""
    if state.hasTimedOut:
        total = state.get[0]
        state.remove()
        yield pd.DataFrame({"user": [key[0]], "total": [total], "timedOut": [True]})
        return
    total = (state.get[0] if state.exists else 0) + sum(int(p["v"].sum()) for p in pdfs)
    state.update((total,))
    state.setTimeoutDuration(1_000)
    yield pd.DataFrame({"user": [key[0]], "total": [total], "timedOut": [False]})


def event_time_sessions(key, pdfs, state):
    """Event-time timeout at the latest event time seen plus 10 s; several rows out."""
    if state.hasTimedOut:
        count, latest = state.get
        state.remove()
        yield pd.DataFrame({"user": [key[0]] * 2, "what": ["closed", "latest"],
                            "value": [count, latest]})
        return
    count, latest = state.get if state.exists else (0, 0)
    for pdf in pdfs:
        count += len(pdf)
        latest = max(latest, int(pdf["ts"].max().timestamp() * 1000))
    state.update((count, latest))
    state.setTimeoutTimestamp(latest + 10_000)
    yield pd.DataFrame({"user": [key[0]], "what": ["open"], "value": [count]})


def remove_on_third(key, pdfs, state):
    """Removes the state every third call, so it is re-created afterwards."""
    calls = (state.get[0] if state.exists else 0) + 1
    rows = sum(len(p) for p in pdfs)
    if calls % 3 == 0:
        state.remove()
    else:
        state.update((calls,))
    yield pd.DataFrame({"user": [key[0]], "calls": [calls], "rows": [rows],
                        "exists": [state.exists]})


def first_chunk_only(key, pdfs, state):
    """Reads only the first chunk of its input and reports its size."""
    first = next(iter(pdfs))
    state.update((len(first),))
    yield pd.DataFrame({"user": [key[0]], "first": [len(first)]})


def fails_on_boom(key, pdfs, state):
    for pdf in pdfs:
        if (pdf["user"] == "boom").any():
            raise ValueError("the user function failed on purpose")
    state.update((1,))
    yield pd.DataFrame({"user": [key[0]], "count": [1]})


def misuses_state(key, pdfs, state):
    """Exercises GroupState's errors: each misuse must raise as in PySpark."""
    errors = []
    for attempt in (lambda: state.update(None), lambda: state.setTimeoutTimestamp(1000),
                    lambda: state.get, lambda: state.getCurrentWatermarkMs()):
        try:
            attempt()
            errors.append("none")
        except Exception as e:  # noqa: BLE001 - the class name is what is compared
            errors.append(type(e).__name__)
    list(pdfs)
    state.update((len(errors),))
    yield pd.DataFrame({"user": [key[0]], "errors": [",".join(errors)],
                        "processingTime": [state.getCurrentProcessingTimeMs() > 0]})


def mixed_output_frames(key, pdfs, state):
    """Output frames that pd.concat must reconcile: other column order, float counts, none."""
    n = sum(len(p) for p in pdfs)
    state.update((n,))
    if key[0] == "b":
        yield pd.DataFrame({"count": [float(n)], "user": [key[0]]})
    elif key[0] == "c":
        yield pd.DataFrame({"user": [], "count": []})
    else:
        yield pd.DataFrame({"user": [key[0], key[0]], "count": [n, n + 1]})


def looks_for_other_queries_state(key, pdfs, state):
    """A hostile state function: counts the rows of other queries' state it can reach in
    its own process through the garbage collector."""
    import gc

    from arrowstate.store.versions.versioned import VersionedState

    foreign = 0
    for obj in gc.get_objects():
        if isinstance(obj, VersionedState) and len(obj):
            users = obj.rows.take(obj.rows.live_ids()).column(0).to_pylist()
            foreign += sum(1 for u in users if isinstance(u, str) and u.startswith("secret"))
    sum(len(pdf) for pdf in pdfs)   # read the input, as a real function does
    state.update((1,))
    yield pd.DataFrame({"user": [key[0]], "foreign": [foreign]})


def reports_its_environment(key, pdfs, state):
    """What Spark promises a function: TaskContext, spark.executorEnv.*, shipped modules."""
    import os

    from pyspark import TaskContext

    import arrowstate_shipped_module as shipped

    context = TaskContext.get()
    sum(len(pdf) for pdf in pdfs)   # read the input, as a real function does
    state.update((1,))
    yield pd.DataFrame({
        "user": [key[0]], "partition": [context.partitionId()],
        "attempt": [context.attemptNumber()], "stage_known": [context.stageId() >= 0],
        "prop": [context.getLocalProperty("arrowstate.test.prop")],
        "env": [os.environ.get("ARROWSTATE_TEST_ENV")], "shipped": [shipped.VALUE]})


def reports_its_interpreter(key, pdfs, state):
    import sys

    sum(len(pdf) for pdf in pdfs)   # read the input, as a real function does
    state.update((1,))
    yield pd.DataFrame({"user": [key[0]], "python": [sys.executable]})


def keeps_latest_timestamp(key, pdfs, state):
    """Keeps the latest event time in state and compares it with new rows' times: the
    stored value must come back in the form pyspark hands the function natively."""
    latest = state.get[0] if state.exists else None
    kind = type(latest).__name__
    for pdf in pdfs:
        for ts in pdf["ts"]:
            ts = ts.to_pydatetime()
            if latest is None or ts > latest:
                latest = ts
    state.update((latest,))
    yield pd.DataFrame({"user": [key[0]], "latest": [str(latest)], "stored_as": [kind]})


def counts_reachable_state(key, pdfs, state):
    """Counts the keys of arrowstate state this function's process holds: its own
    session's (prefix of its key) and others' (any other prefix)."""
    import gc

    from arrowstate.store.versions.versioned import VersionedState

    mine = key[0].split("-")[0]
    own = foreign = 0
    for obj in gc.get_objects():
        if isinstance(obj, VersionedState) and len(obj):
            for user in obj.rows.take(obj.rows.live_ids()).column(0).to_pylist():
                if isinstance(user, str):
                    if user.startswith(mine + "-"):
                        own += 1
                    else:
                        foreign += 1
    sum(len(pdf) for pdf in pdfs)   # read the input, as a real function does
    state.update((1,))
    yield pd.DataFrame({"user": [key[0]], "own": [own], "foreign": [foreign]})


def _python_value(v):
    """A value from the input frame in a form GroupState.update takes natively: numpy
    arrays as lists, Arrow maps (lists of pairs) as dicts, pandas' missing values as None."""
    import numpy as np
    if isinstance(v, np.ndarray):
        return [_python_value(e) for e in v.tolist()]
    if isinstance(v, list):
        if v and all(isinstance(e, tuple) and len(e) == 2 for e in v):
            return {k: _python_value(x) for k, x in v}
        return [_python_value(e) for e in v]
    if isinstance(v, dict):
        return {k: _python_value(x) for k, x in v.items()}
    if v is None or (np.isscalar(v) and pd.isna(v)) or v is pd.NaT:
        return None
    return v


def keeps_last_value(key, pdfs, state):
    """Keeps the group's latest value of k in state and shows how the stored value comes
    back: its type and repr, as the function sees them."""
    prev = state.get if state.exists else None
    n = prev[1] if prev else 0
    last = prev[0] if prev else None
    for pdf in pdfs:
        n += len(pdf)
        last = _python_value(pdf["k"].iloc[-1])
    state.update((last, n))
    seen = None if prev is None else f"{type(prev[0]).__name__}: {prev[0]!r}"
    yield pd.DataFrame({"g": [key[0]], "last": [prev[0] if prev else None], "seen": [seen],
                        "n": [n]})


def keeps_last_values(key, pdfs, state):
    """keeps_last_value for every column k0, k1, ... at once: the state holds each one's
    latest value and the count; the output shows how each stored value comes back."""
    prev = state.get if state.exists else None
    n = prev[-1] if prev else 0
    last = list(prev[:-1]) if prev else None
    for pdf in pdfs:
        columns = [c for c in pdf.columns if c.startswith("k")]
        n += len(pdf)
        last = [_python_value(pdf[c].iloc[-1]) for c in columns]
    state.update((*last, n))
    row = {"g": [key[0]]}
    for i in range(len(last)):
        row[f"last{i}"] = [prev[i] if prev else None]
        row[f"seen{i}"] = [None if prev is None else f"{type(prev[i]).__name__}: {prev[i]!r}"]
    row["n"] = [n]
    yield pd.DataFrame(row)


COERCED_STATE = ("d double, f float, i int, b tinyint, l bigint, s string, bin binary, "
                 "dec decimal(10,2), ts timestamp, day date, st struct<a:int,b:string>")
# What a function may hand state.update for those fields: each is stored as native Spark
# stores it (some as null, some wrapped or rounded).
COERCIONS = [
    (1, 2, 3, 4, 5, "x", b"\x00\xff", decimal.Decimal("1.005"),
     dt.datetime(2024, 1, 1, 12), dt.date(2024, 2, 29),
     {"a": 1, "b": "y"}),
    (1.5, 2.5, 3.7, 300, 2**40, 42, "text", 1.25, pd.Timestamp("2024-03-01 10:00"),
     dt.datetime(2024, 3, 1, 23, 59), (2, "z")),
    (np.float64(1.25), np.float32(0.1), np.int64(7), True, 2**70, 1.5,
     bytearray(b"ab"), decimal.Decimal("-99999999.994"), None, None, None),
    (True, None, np.int8(-3), -129, -(2**63), True, None, decimal.Decimal("12E-1"),
     dt.datetime(1900, 1, 1), dt.date(1, 1, 1), [5, None]),
]


def stores_coerced_values(key, pdfs, state):
    """Updates state with the batch's entry of COERCIONS and shows what came back of the
    previous one."""
    batch = 0
    for pdf in pdfs:
        batch = int(pdf["n"].max())
    prev = state.get if state.exists else None
    state.update(COERCIONS[batch % len(COERCIONS)])
    seen = None if prev is None else repr(prev)
    yield pd.DataFrame({"g": [key[0]], "seen": [seen]})
