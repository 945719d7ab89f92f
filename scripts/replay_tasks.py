"""A bench case's state work again, without Spark: record what its workers' families are
handed in one run, then replay those tasks in this process as often as needed, timing each
phase (a second or two a replay, where a profiled Spark run takes a minute).

    python scripts/replay_tasks.py record DIR --case session_window_append [--rows 1000000]
                                   [--batches 5] [--keys 50000]
    python scripts/replay_tasks.py replay DIR [--repeat 3] [--profile 30]
    python scripts/replay_tasks.py wire DIR [--repeat 3] [--profile 30]

`record` runs the case once with arrowstate on, its state workers started by bench_lib.worker
(ARROWSTATE_BENCH_RECORD_DIR): Spark's SQL operators' cases only (a user function's workers
start with the function's own interpreter, which bench_lib.worker does not wrap). `replay` runs every recorded task in order of state and
version, as the worker runs it with its state kept in memory between tasks: the family
made from the task's header, each lookup and process call with the recorded batch, finish,
and the commit's file encoding (no checkpoint is written). It prints the seconds per phase
for each repeat, and with --profile the functions with the most own time under cProfile.

`wire` serves again what the JVM sent each worker of a run (recorded with
ARROWSTATE_BENCH_WIRE_DIR, any case or bench mode): each <pid>.wire through a Worker of its
own in this process, its answers dropped, the CPU seconds a task of the whole worker (the
frames, headers, families, commits and metrics; not the socket's system calls), and the
median of each task's CPU in serve_task, which ARROWSTATE_BENCH_TASK_CPU_DIR times in Spark.
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import gc
import glob
import io
import json
import os
import pickle
import pstats
import shutil
import statistics
import sys
import tempfile
import time

import pyarrow as pa


def record(args) -> None:
    from pyspark.sql import SparkSession

    import arrowstate
    import bench
    from bench_lib.worker import session_settings

    os.makedirs(args.dir, exist_ok=True)
    settings = session_settings(record_dir=os.path.abspath(args.dir))
    spark = arrowstate.configure(
        SparkSession.builder.master("local[2]").appName("arrowstate-record")
        .config("spark.sql.shuffle.partitions", "4").config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    ).config(map=settings).getOrCreate()
    source = tempfile.mkdtemp(prefix="record-in-")
    try:
        bench.write_batches(source, args.rows, args.batches, args.keys)
        seconds, _ = bench.run_once(spark, source, bench.CASES[args.case], True)
        if not glob.glob(os.path.join(args.dir, "*.pkl")):
            raise SystemExit(f"replay_tasks: nothing recorded for {args.case}: only the SQL "
                             "operators' workers are bench_lib.worker's")
        print(json.dumps({"case": args.case, "recorded_to": args.dir,
                          "run_s": round(seconds, 2)}))
    finally:
        spark.stop()
        shutil.rmtree(source, ignore_errors=True)


def load(directory: str) -> list:
    tasks = []
    for path in glob.glob(os.path.join(directory, "*.pkl")):
        with open(path, "rb") as f:
            while True:
                try:
                    tasks.append(pickle.load(f))
                except EOFError:
                    break
    tasks.sort(key=lambda t: (t[1]["stateKey"], t[1]["version"]))
    return tasks


def replay(tasks: list, timing: collections.Counter, hash_table_min_keys: int) -> None:
    from arrowstate import protocol
    from arrowstate.families import REGISTRY
    from arrowstate.store.held.budget import MemoryBudget
    from arrowstate.store.formats.container import STATE_FIGURES
    from arrowstate.store.held.states import new_state

    budget = MemoryBudget()
    states: dict = {}
    snapshots = tempfile.mkdtemp(prefix="replay-snapshots-")
    try:
        for _, header, schema, calls in tasks:
            family = REGISTRY[header["family"]](header["operator"],
                                                pa.ipc.read_schema(pa.py_buffer(schema)))
            key, version, conf = header["stateKey"], header["version"], header["conf"]
            budget.configure(header)
            state = states.get(key)
            if state is None:
                state = new_state(family, key, budget)
                family.rebuild_index(state)
            for name, payload in calls:
                batch = protocol.ipc_to_batch(payload)
                start = time.perf_counter()
                getattr(family, name)(state, batch)
                timing[name] += time.perf_counter() - start
            start = time.perf_counter()
            # finish is a generator: its work runs as its batches are read (and dropped)
            collections.deque(family.finish(state), maxlen=0)
            timing["finish"] += time.perf_counter() - start
            start = time.perf_counter()
            family.metrics.setdefault("numTotalStateRows", len(state))   # as the worker
            state.commit_files(version + 1, int(conf["minVersionsToRetain"]),
                               {k: family.metrics.get(k, 0) for k in STATE_FIGURES})
            timing["commit"] += time.perf_counter() - start
            state.mark_committed(version + 1, int(conf["minDeltasForSnapshot"]), snapshots)
            if state.move_to_hash_table(hash_table_min_keys):   # as the worker does
                family.rebuild_index(state)
            states[key] = state
    finally:
        for state in states.values():
            state.close()
        shutil.rmtree(snapshots, ignore_errors=True)


def replay_wire(paths: list[str]) -> tuple[list[float], float]:
    """Each recorded worker's conversation served again: each task's CPU seconds in
    serve_task (as ARROWSTATE_BENCH_TASK_CPU_DIR times them in Spark) and the CPU seconds
    of the whole."""
    from arrowstate import worker

    class Recorded:
        def __init__(self, data: bytes) -> None:
            self.read = io.BytesIO(data).read

        def write(self, b) -> None:
            return None

        def flush(self) -> None:
            return None

    local = tempfile.mkdtemp(prefix="replay-wire-")
    served: list[float] = []
    serve_task = worker.Worker.serve_task

    def task(self, f, header, schema):
        header = {**header, "localDir": local}
        start = time.thread_time()
        try:
            return serve_task(self, f, header, schema)
        finally:
            served.append(time.thread_time() - start)

    worker.Worker.serve_task = task
    thresholds = gc.get_threshold()
    gc.set_threshold(*worker.GC_THRESHOLDS)   # as a worker collects (worker.run)
    spent = 0.0
    try:
        for path in paths:
            with open(path, "rb") as f:
                conversation = Recorded(f.read())
            start = time.process_time()
            worker.Worker().serve(conversation)
            spent += time.process_time() - start
    finally:
        worker.Worker.serve_task = serve_task
        gc.set_threshold(*thresholds)
        shutil.rmtree(local, ignore_errors=True)
    return served, spent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=("record", "replay", "wire"))
    parser.add_argument("dir")
    parser.add_argument("--case", default="session_window_append")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hash-table-min-keys", type=int, default=None,
                        help="keys from which a state moves to the compiled hash table "
                             "(default: the worker's HASH_TABLE_MIN_KEYS)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="one more replay under cProfile: its N functions of most own time")
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if args.what == "record":
        record(args)
        return
    if args.what == "wire":
        paths = sorted(glob.glob(os.path.join(args.dir, "*.wire")))
        for _ in range(args.repeat):
            served, spent = replay_wire(paths)
            print(json.dumps({"workers": len(paths), "tasks": len(served),
                              "cpu_s": round(spent, 3),
                              "cpu_ms_per_task": round(spent * 1000 / max(len(served), 1), 3),
                              "serve_task_us_median": round(statistics.median(served) * 1e6)
                              if served else None}),
                  flush=True)
        if args.profile:
            profile = cProfile.Profile(time.process_time)
            profile.enable()
            replay_wire(paths)
            profile.disable()
            pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)
        return
    if args.hash_table_min_keys is None:
        from arrowstate.store.held.states import HASH_TABLE_MIN_KEYS
        args.hash_table_min_keys = HASH_TABLE_MIN_KEYS
    tasks = load(args.dir)
    print(json.dumps({"tasks": len(tasks), "calls": sum(len(t[3]) for t in tasks)}))
    for _ in range(args.repeat):
        timing: collections.Counter = collections.Counter()
        replay(tasks, timing, args.hash_table_min_keys)
        print(json.dumps({**{k: round(v, 3) for k, v in timing.items()},
                          "total": round(sum(timing.values()), 3)}), flush=True)
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        replay(tasks, collections.Counter(), args.hash_table_min_keys)
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
