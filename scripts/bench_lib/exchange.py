"""bench.py --exchange: what the exchange with the Python worker costs Spark's SQL stateful
operators apart from the state work done in Python.

Per case, in one process and alternated after --warmup rounds (medians of --runs):
arrowstate as it is; arrowstate with its workers doing no state work (each frame the
operator sends is read and answered "nothing stored", nothing is stored, nothing emitted,
the commit writes an empty delta); the case's work with no state (each micro-batch alone,
bench_lib.sql); and that with Spark's own trip of its result rows to a Python worker and back.
Each one's cost per input row over no state says where a state cost goes: the exchange
(rows out to the worker and the answers back), the result rows' way back (within the trip)
and Python's state work (arrowstate less the exchange). The run with no state work gives
wrong answers on purpose: it is a measurement, never a query's result.

The workers of this mode are bench_lib.worker's, which skip the state work while a marker
file exists, so one process runs both without restarting Spark.
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile


def exchange(spark, args, cases: dict, run_once, write_batches) -> list[dict]:
    """Per SQL case of --cases, one JSON line of the four kinds of run (medians, seconds)
    and their costs per input row over no state."""
    from bench_lib.sql import _each_batch_alone, is_sql_case
    from bench_lib.worker import SKIP_FILE
    marker = os.environ[SKIP_FILE]
    source = tempfile.mkdtemp(prefix="bench-in-")
    write_batches(source, args.rows, args.batches, args.keys)

    def arrowstate_run(case, skip: bool) -> float:
        if skip:
            open(marker, "w").close()
        try:
            return run_once(spark, source, case, True)[0]
        finally:
            if skip:
                os.remove(marker)

    def no_state_run(case, trip: bool) -> float:
        spark.conf.set("spark.arrowstate.enabled", "false")
        return _each_batch_alone(spark, source, case[0], trip)

    modes = {"arrowstate": lambda c: arrowstate_run(c, False),
             "no_state_work": lambda c: arrowstate_run(c, True),
             "no_state": lambda c: no_state_run(c, False),
             "no_state_with_python_trip": lambda c: no_state_run(c, True)}
    results = []
    for name in args.cases.split(","):
        case = cases[name]
        if not is_sql_case(case):
            continue
        times: dict[str, list[float]] = {m: [] for m in modes}
        for i in range(args.warmup + args.runs):
            for mode in (list(modes) if i % 2 == 0 else list(modes)[::-1]):
                seconds = modes[mode](case)
                if i >= args.warmup:
                    times[mode].append(seconds)
        median = {m: statistics.median(t) for m, t in times.items()}

        def per_row(seconds: float) -> float:
            return round((seconds - median["no_state"]) / args.rows * 1e6, 3)

        figures = {"case": name, "rows": args.rows, "runs": args.runs,
                   **{f"{m}_s": round(s, 3) for m, s in median.items()},
                   "state_us_per_row": per_row(median["arrowstate"]),
                   "exchange_us_per_row": per_row(median["no_state_work"]),
                   "python_trip_us_per_row": per_row(median["no_state_with_python_trip"]),
                   "python_state_work_us_per_row": round(
                       (median["arrowstate"] - median["no_state_work"]) / args.rows * 1e6, 3),
                   "runs_s": {m: [round(s, 2) for s in t] for m, t in times.items()}}
        print(json.dumps(figures), flush=True)
        results.append(figures)
    return results
