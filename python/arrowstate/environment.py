"""The environment Spark gives Python code in a task, set up in the state worker as
pyspark's own worker sets it up: the TaskContext, SparkFiles' root and the files shipped
with `--py-files` / `addPyFile` on sys.path, and the memory limit of
`spark.executor.pyspark.memory`."""
from __future__ import annotations

import os
import sys
from typing import Any


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
    """`spark.executor.pyspark.memory`, passed as Spark passes it to its own workers."""
    from pyspark.worker_util import setup_memory_limits

    setup_memory_limits(int(os.environ.get("PYSPARK_EXECUTOR_MEMORY_MB", "-1")))
