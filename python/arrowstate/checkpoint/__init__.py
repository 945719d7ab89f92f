"""A streaming checkpoint's state, offline (`python -m arrowstate state describe|history|
export|import|repartition`), in modules by concern: files (the checkpoint's files and logs),
inventory (describe), history, conversion (export, import) and repartitioning.
"""
from __future__ import annotations

from .conversion import export_to_spark, import_from_spark
from .files import (ARROWSTATE, HDFS, ROCKSDB, CheckpointError, LocalFiles, last_committed_batch,
                    offset_conf, partition_engine, read_schema_file)
from .history import format_history, history, plot_history, require_plotting
from .inventory import FAMILIES, Operator, describe, format_text
from .repartitioning import repartition

__all__ = ["ARROWSTATE", "HDFS", "ROCKSDB", "FAMILIES", "CheckpointError", "LocalFiles",
           "Operator", "describe", "export_to_spark", "format_history", "format_text", "history",
           "import_from_spark", "plot_history", "require_plotting",
           "last_committed_batch", "offset_conf", "partition_engine", "read_schema_file",
           "repartition", "state_command"]


def state_command(command: str, checkpoint: str, partitions: int | None = None,
                  time_zone: str | None = None, operator: int | None = None,
                  planning: int | None = None) -> dict:
    """What `python -m arrowstate state <command>` prints as JSON (describe's --json);
    export's `operator` and `planning` are its --operator and --planning-batch. The
    checkpoint is a local path, or a `file:` URI as Spark names it."""
    if checkpoint.startswith("file:"):
        from urllib.parse import unquote, urlparse
        checkpoint = unquote(urlparse(checkpoint).path)
    return {"describe": lambda: describe(checkpoint),
            "history": lambda: history(checkpoint),
            "export": lambda: export_to_spark(checkpoint, operator, planning),
            "import": lambda: import_from_spark(checkpoint, time_zone),
            "repartition": lambda: repartition(checkpoint, partitions, time_zone)}[command]()
