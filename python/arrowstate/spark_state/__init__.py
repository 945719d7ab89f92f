"""Spark's view of arrowstate's state: each family's rows in Spark's layout, and the tools
that read and convert a checkpoint's state through it, in modules by concern:
- layout: what a family's layout is (`SparkLayout`), and Spark's types as Arrow's;
- dedup, aggregate, session_window, flatmap, transform_with_state: each family's layout;
- layouts: the layouts by family, and the one a request with schemas alone reads by;
- readers: Spark's state readers on arrowstate's files (READ_STATE);
- importing: Spark's rows as an arrowstate snapshot (IMPORT_STATE);
- checkpoint_files: a checkpoint's files and logs, as Spark names and writes them;
- filesystems: where they are read and written: the local disk, or Hadoop's FileSystem
  (HDFS, object stores) through a Spark session's JVM;
- inventory (`state describe`), history (`state history`), conversion (`state export`,
  `state import`) and repartitioning (`state repartition`), offline: `python -m
  arrowstate state ...`, or the functions below.
The live families (arrowstate.families) import their layouts from here; nothing here
imports a live family.
"""
from __future__ import annotations

from .checkpoint_files import (ARROWSTATE, HDFS, ROCKSDB, CheckpointError, PartitionFiles,
                               last_committed_batch, offset_conf, partition_engine,
                               read_state_schema_file)
from .conversion import conversion_session, export_to_spark, import_from_spark
from .filesystems import is_remote
from .history import format_history, history, plot_history, require_plotting
from .inventory import FAMILIES, Operator, describe, format_text
from .repartitioning import repartition

__all__ = ["ARROWSTATE", "HDFS", "ROCKSDB", "FAMILIES", "CheckpointError", "PartitionFiles",
           "Operator", "describe", "export_to_spark", "format_history", "format_text", "history",
           "import_from_spark", "plot_history", "require_plotting",
           "last_committed_batch", "offset_conf", "partition_engine", "read_state_schema_file",
           "repartition", "state_command"]


def state_command(command: str, checkpoint: str, partitions: int | None = None,
                  time_zone: str | None = None, operator: int | None = None,
                  planning: int | None = None, spark_conf: dict | None = None) -> dict:
    """What `python -m arrowstate state <command>` prints as JSON (describe's --json);
    export's `operator` and `planning` are its --operator and --planning-batch. The
    checkpoint is a local path, a `file:` URI as Spark names it, or a URI of any filesystem
    Hadoop reaches (`hdfs://`, `s3a://` ...): read and written through Hadoop's FileSystem
    in the conversion session (spark_state.conversion), opened first; for describe and
    history too, which need no Spark on the local disk. `spark_conf` (the command line's
    --conf) configures a Spark the command starts (not a session already running)."""
    if checkpoint.startswith("file:"):
        from urllib.parse import unquote, urlparse
        checkpoint = unquote(urlparse(checkpoint).path)
    run = {"describe": lambda: describe(checkpoint),
           "history": lambda: history(checkpoint),
           "export": lambda: export_to_spark(checkpoint, operator, planning, spark_conf),
           "import": lambda: import_from_spark(checkpoint, time_zone, spark_conf),
           "repartition": lambda: repartition(checkpoint, partitions, time_zone,
                                              spark_conf)}[command]
    if not is_remote(checkpoint):
        return run()
    with conversion_session(f"arrowstate state {command}", {}, on_driver=planning is not None,
                            spark_conf=spark_conf):
        return run()
