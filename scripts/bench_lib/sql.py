"""Spark's SQL stateful operators against the most any state operator could reach.

`no_state_figures`: beside a case's native and arrowstate runs, the same work per
micro-batch with no state at all: each micro-batch deduplicated or aggregated alone, as a
batch query, through foreachBatch into a no-op sink (read, shuffle and the batch plan's own
work, nothing carried between batches). Its time is what a state operator that cost nothing
would take; the state operator's own cost per input row is each engine's time less it.
Beside it the same with each batch's result rows taken to a Python worker and back as they
are (`mapInArrow`, Spark's own trip): what an operator whose state lives in Python pays at
least once for the rows it stores, were its Python free (`python_trip_us_per_row`).

`small_batches`: many micro-batches of few rows at Spark's default 200 shuffle partitions,
where per-task costs (a worker hand-off per partition, commit, file writes, metrics)
dominate: per-trigger time of each engine (medians over the batches with input, after the
first), and commitTimeMs summed over the state operators' tasks; the engines alternate run
by run after --warmup rounds of each.
"""
from __future__ import annotations

import shutil
import statistics
import tempfile
import time

from bench_lib.functions import as_they_are

SMALL_BATCH_CASES = ("agg_update", "dedup", "apply_in_pandas_with_state")


def _each_batch_alone(spark, source: str, build, python_trip: bool = False) -> float:
    """Seconds to run `build` over every file of `source`, each micro-batch as a batch
    query of its own (foreachBatch into the noop sink); with `python_trip`, its result rows
    go to a Python worker and back on the way."""
    checkpoint = tempfile.mkdtemp(prefix="bench-ck-")

    def alone(df, _batch_id):
        out = build(df)
        if python_trip:
            out = out.mapInArrow(as_they_are, out.schema)
        out.write.format("noop").mode("overwrite").save()

    try:
        stream = (spark.readStream.schema("key long, user string, ts timestamp, value double")
                  .option("maxFilesPerTrigger", 1).parquet(source))
        t0 = time.perf_counter()
        q = (stream.writeStream.foreachBatch(alone).trigger(availableNow=True)
             .option("checkpointLocation", checkpoint).start())
        q.awaitTermination()
        return time.perf_counter() - t0
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)


def no_state_figures(spark, source: str, case, rows: int, runs: int, warmup: int,
                     native_s: float | None, arrowstate_s: float) -> dict:
    """The case's work with no state (medians of `runs` after `warmup` rounds, as the
    engines' runs have), and each engine's state cost in microseconds per input row against
    it (Spark's left out without `native_s`)."""
    spark.conf.set("spark.arrowstate.enabled", "false")
    medians = {}
    for _ in range(warmup):
        for trip in (False, True):
            _each_batch_alone(spark, source, case[0], trip)
    for trip in (False, True):
        medians[trip] = statistics.median(_each_batch_alone(spark, source, case[0], trip)
                                          for _ in range(runs))
    seconds = medians[False]
    return {"no_state_rows_per_s": round(rows / seconds),
            "no_state_s": round(seconds, 3),
            "no_state_with_python_trip_s": round(medians[True], 3),
            "python_trip_us_per_row": round((medians[True] - seconds) / rows * 1e6, 3),
            **({} if native_s is None else
               {"native_state_us_per_row": round((native_s - seconds) / rows * 1e6, 3)}),
            "arrowstate_state_us_per_row": round((arrowstate_s - seconds) / rows * 1e6, 3)}


def small_batches(spark, args, cases: dict, run_once, write_batches,
                  requests=lambda: {}) -> list[dict]:
    """Per case, the per-trigger time and the commit and update times (Spark's
    commitTimeMs and allUpdatesTimeMs, summed over the tasks) of each engine over
    --small-batch-count micro-batches of --small-batch-rows rows at
    --small-batch-partitions shuffle partitions (medians of --runs runs, the engines
    alternating, after --warmup rounds), the CPU a stateful task costs (a run's CPU of the
    JVM and of the state workers over its batches x partitions: `*_cpu_ms_per_task`, the
    JVM's including the scan stage, the same work for both engines), and on an object store
    the requests a batch makes (`requests()`: the store's so far, by type)."""
    from bench_lib.checkpoints import per_batch
    from procinfo import jvm_and_state_worker_cpu_seconds
    import json
    engines = (True,) if args.arrowstate_only else (False, True)
    source = tempfile.mkdtemp(prefix="bench-small-")
    write_batches(source, args.small_batch_rows * args.small_batch_count,
                  args.small_batch_count, args.keys)
    before = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", str(args.small_batch_partitions))
    results = []
    try:
        for name in args.cases.split(","):
            figures = {"case": name, "checkpoint": args.checkpoint,
                       "partitions": args.small_batch_partitions,
                       "rows_per_batch": args.small_batch_rows,
                       "batches": args.small_batch_count, "runs": args.runs}
            # the engines alternate, after --warmup rounds of each (worker start, JIT)
            for i in range(args.warmup):
                for on in (engines if i % 2 == 0 else engines[::-1]):
                    run_once(spark, source, cases[name], on)
            triggers = {False: [], True: []}
            commits = {False: [], True: []}
            updates = {False: [], True: []}
            asked = {False: [], True: []}
            cpu = {False: [], True: []}   # (JVM, state workers) ms per stateful task
            for i in range(args.runs):
                for on in (engines[::-1] if i % 2 == 0 else engines):
                    asked_before, cpu_before = requests(), jvm_and_state_worker_cpu_seconds()
                    _, progress = run_once(spark, source, cases[name], on)
                    spent = [b - a for a, b in zip(cpu_before,
                                                   jvm_and_state_worker_cpu_seconds())]
                    tasks = len(progress) * args.small_batch_partitions
                    cpu[on].append([s * 1000 / tasks for s in spent])
                    asked[on].append(per_batch(asked_before, requests(), len(progress)))
                    steady = [p for p in progress[1:] if p["numInputRows"]]
                    triggers[on].append(statistics.median(
                        p["durationMs"]["triggerExecution"] for p in steady))
                    commits[on].append(statistics.median(
                        sum(op["commitTimeMs"] for op in p["stateOperators"])
                        for p in steady))
                    updates[on].append(statistics.median(
                        sum(op["allUpdatesTimeMs"] for op in p["stateOperators"])
                        for p in steady))
            for on in engines:
                engine = "arrowstate" if on else "native"
                figures[f"{engine}_trigger_ms"] = round(statistics.median(triggers[on]))
                figures[f"{engine}_commit_ms_summed_over_tasks"] = round(
                    statistics.median(commits[on]))
                figures[f"{engine}_update_ms_summed_over_tasks"] = round(
                    statistics.median(updates[on]))
                figures[f"{engine}_jvm_cpu_ms_per_task"] = round(
                    statistics.median(c[0] for c in cpu[on]), 3)
                if on:
                    figures["arrowstate_worker_cpu_ms_per_task"] = round(
                        statistics.median(c[1] for c in cpu[on]), 3)
                if asked[on][0]:
                    figures[f"{engine}_store_requests_per_batch"] = asked[on][-1]
            if False in engines:
                figures["arrowstate_vs_native_trigger"] = round(
                    figures["arrowstate_trigger_ms"] / figures["native_trigger_ms"], 3)
            print(json.dumps(figures), flush=True)
            results.append(figures)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)
        shutil.rmtree(source, ignore_errors=True)
    return results


def is_sql_case(case) -> bool:
    """A case of Spark's SQL stateful operators (deduplication, aggregation, session
    windows): no user function."""
    return case[2] in ("ArrowStreamingDeduplicate", "ArrowStateStoreSave",
                       "ArrowSessionWindowStateStoreSave")
