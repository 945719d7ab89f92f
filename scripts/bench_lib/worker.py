"""State workers for measurements: `arrowstate.worker` with its families wrapped, started
through `bench_lib/worker_python` (as `spark.arrowstate.pythonExec`, see `session_settings`).

- ARROWSTATE_BENCH_SKIP_FILE: while that file exists the families do no state work: each
  frame is read and answered "nothing stored", nothing is stored or emitted (bench.py
  --exchange; wrong answers on purpose, a measurement only).
- ARROWSTATE_BENCH_RECORD_DIR: every task's header, input schema and the batches its family
  was handed are appended to <dir>/<pid>.pkl, for replay_tasks.py to run again without
  Spark.
- ARROWSTATE_BENCH_WIRE_DIR: every byte a worker reads from the JVM is appended to
  <dir>/<pid>.wire, for `replay_tasks.py wire` to serve again in one process, the whole
  worker (frames, headers, families, commits, metrics) but the socket's system calls.
- ARROWSTATE_BENCH_TASK_CPU_DIR: each task's CPU time in the thread that serves it (the
  time the worker runs its Python and system calls for the task, not its waits for the
  JVM) is appended to <dir>/<pid>.txt, in microseconds, a line a task (written every 100
  tasks); `replay_tasks.py wire` prints the same figure for the same tasks without Spark.
- ARROWSTATE_BENCH_PROFILE_DIR: each task is profiled by cProfile on the process's CPU clock
  (time waiting for the JVM counts nothing), the stats so far written to <dir>/<pid>.prof
  every 100 tasks (`python -m pstats`, or pstats.Stats over several files).
"""
from __future__ import annotations

import functools
import os
import pickle
import sys
import tempfile
import time

SKIP_FILE = "ARROWSTATE_BENCH_SKIP_FILE"
RECORD_DIR = "ARROWSTATE_BENCH_RECORD_DIR"
PROFILE_DIR = "ARROWSTATE_BENCH_PROFILE_DIR"
WIRE_DIR = "ARROWSTATE_BENCH_WIRE_DIR"
TASK_CPU_DIR = "ARROWSTATE_BENCH_TASK_CPU_DIR"
WRAPPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_python")
HANDED = ("lookup", "process", "initial_state")   # the family calls a task's frames make


def session_settings(skip: bool = False, record_dir: str | None = None) -> dict:
    """The Spark settings of a session whose state workers are these, and their environment
    (set here: call it before Spark starts). Returns the settings."""
    if skip:
        os.environ[SKIP_FILE] = os.path.join(tempfile.mkdtemp(prefix="bench-skip-"), "skip")
    if record_dir:
        os.environ[RECORD_DIR] = record_dir
    os.environ["ARROWSTATE_BENCH_PYTHON"] = sys.executable
    return {"spark.arrowstate.pythonExec": WRAPPER}


_task: dict = {}   # the task being served: its header, input schema and calls (recording)


def _wrapped(method, name: str, empty):
    from arrowstate.protocol import batch_to_ipc
    marker = os.environ.get(SKIP_FILE, "")
    recording = bool(os.environ.get(RECORD_DIR)) and name in HANDED

    @functools.wraps(method)
    def call(self, state, *args):
        if recording:
            _task["calls"].append((name, batch_to_ipc(args[0])))
        if marker and os.path.exists(marker):
            return empty()
        return method(self, state, *args)
    return call


def _recording_tasks(serve_task, directory: str):
    @functools.wraps(serve_task)
    def serve(self, f, header, input_schema):
        _task.update(header=header, schema=input_schema.serialize().to_pybytes(), calls=[])
        try:
            return serve_task(self, f, header, input_schema)
        finally:
            with open(os.path.join(directory, f"{os.getpid()}.pkl"), "ab") as out:
                pickle.dump((time.time(), _task["header"], _task["schema"], _task["calls"]),
                            out)
    return serve


def _profiled_tasks(serve_task, directory: str):
    import cProfile
    profile = cProfile.Profile(time.process_time)
    served = [0]

    @functools.wraps(serve_task)
    def serve(self, f, header, input_schema):
        profile.enable()
        try:
            return serve_task(self, f, header, input_schema)
        finally:
            profile.disable()
            served[0] += 1
            if served[0] % 100 == 0:
                profile.dump_stats(os.path.join(directory, f"{os.getpid()}.prof"))
    return serve


def _timed_tasks(serve_task, directory: str):
    served: list[float] = []

    @functools.wraps(serve_task)
    def serve(self, f, header, input_schema):
        start = time.thread_time()
        try:
            return serve_task(self, f, header, input_schema)
        finally:
            served.append(time.thread_time() - start)
            if len(served) == 100:
                with open(os.path.join(directory, f"{os.getpid()}.txt"), "a") as out:
                    out.writelines(f"{s * 1e6:.0f}\n" for s in served)
                served.clear()
    return serve


def _recording_wire(directory: str) -> None:
    """The connection's reads teed to <directory>/<pid>.wire as they come (flushed each time:
    Spark may kill an idle worker without a word)."""
    from arrowstate import connection
    out = open(os.path.join(directory, f"{os.getpid()}.wire"), "ab")

    class Teed(connection._Reads):
        def readinto(self, buffer) -> int:
            n = super().readinto(buffer)
            out.write(memoryview(buffer)[:n])
            out.flush()
            return n

    connection._Reads = Teed


def main() -> None:
    from arrowstate import worker
    from arrowstate.families import REGISTRY
    for family in set(REGISTRY.values()):
        for name, empty in (("lookup", lambda: None), ("process", lambda: None),
                            ("initial_state", lambda: None), ("finish", lambda: iter(()))):
            if hasattr(family, name):
                setattr(family, name, _wrapped(getattr(family, name), name, empty))
    if os.environ.get(RECORD_DIR):
        worker.Worker.serve_task = _recording_tasks(worker.Worker.serve_task,
                                                    os.environ[RECORD_DIR])
    if os.environ.get(WIRE_DIR):
        _recording_wire(os.environ[WIRE_DIR])
    if os.environ.get(TASK_CPU_DIR):
        worker.Worker.serve_task = _timed_tasks(worker.Worker.serve_task,
                                                os.environ[TASK_CPU_DIR])
    if os.environ.get(PROFILE_DIR):
        worker.Worker.serve_task = _profiled_tasks(worker.Worker.serve_task,
                                                   os.environ[PROFILE_DIR])
    worker.main()


if __name__ == "__main__":
    main()
