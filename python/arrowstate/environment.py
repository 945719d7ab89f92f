"""The environment Spark gives Python code in a task, set up in the state worker as
pyspark's own worker sets it up: the TaskContext, SparkFiles' root and the files shipped
with `--py-files` / `addPyFile` on sys.path, and the memory limit of
`spark.executor.pyspark.memory`."""
from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
import traceback
from typing import Any, TextIO


def set_task_context(task: dict[str, Any]) -> None:
    """Makes `TaskContext.get()` describe the running task, built as pyspark's worker
    builds it (its keyword constructor)."""
    from pyspark.taskcontext import TaskContext

    TaskContext._setTaskContext(None)   # a singleton: start from a fresh one
    TaskContext._setTaskContext(TaskContext(
        stageId=task["stageId"], partitionId=task["partitionId"],
        attemptNumber=task["attemptNumber"], taskAttemptId=task["taskAttemptId"],
        cpus=task["cpus"], resources={}, localProperties=dict(task["localProperties"])))


def set_spark_files(root: str, includes: list[str]) -> None:
    """SparkFiles' root and the shipped Python files on sys.path (once each)."""
    from pyspark.files import SparkFiles

    SparkFiles._root_directory = root
    SparkFiles._is_running_on_worker = True
    for path in [root] + [os.path.join(root, name) for name in includes]:
        if path not in sys.path:
            sys.path.insert(1, path)


def limit_memory() -> None:
    """`spark.executor.pyspark.memory`, passed as Spark passes it to its own workers (an
    address-space limit). A worker forked from a daemon that has imported what functions
    need already holds that much address space: below it, nothing would work, so it says
    so (MemoryError)."""
    from pyspark.worker_util import setup_memory_limits

    mb = int(os.environ.get("PYSPARK_EXECUTOR_MEMORY_MB", "-1"))
    held = address_space_bytes()
    if mb > 0 and held > mb << 20:   # checked first: under the limit even the error fails
        raise MemoryError(
            f"spark.executor.pyspark.memory gives each Python worker {mb} MB of address "
            f"space, below the {held >> 20} MB this worker holds once it has imported pandas "
            "and pyspark")
    setup_memory_limits(mb)


def address_space_bytes() -> int:
    """This process's virtual memory size (what an address-space limit counts)."""
    with open("/proc/self/status") as f:
        return next((int(line.split()[1]) << 10 for line in f
                     if line.startswith("VmSize:")), 0)


def enable_fault_log() -> TextIO | None:
    """As pyspark's worker does: with `PYTHON_FAULTHANDLER_DIR` set, a crash's traceback goes
    to `<dir>/<pid>`, which Spark's worker handle reads when the worker exits unasked."""
    directory = os.environ.get("PYTHON_FAULTHANDLER_DIR")
    if not directory:
        return None
    try:
        log = open(os.path.join(directory, str(os.getpid())), "w", encoding="utf-8")
    except OSError:
        traceback.print_exc(file=sys.stderr)
        return None
    faulthandler.enable(file=log)
    return log


def record_fault(log: TextIO | None, text: str) -> None:
    """A fatal Python error: to stderr (the executor log) and, for the task's error, the
    fault log."""
    print(text, file=sys.stderr)
    if log is not None:
        log.write(text)
        log.flush()


def close_fault_log(log: TextIO | None) -> None:
    """A clean exit leaves no fault log behind."""
    if log is not None:
        faulthandler.disable()
        log.close()
        with contextlib.suppress(OSError):   # already gone: nothing left behind
            os.remove(log.name)
