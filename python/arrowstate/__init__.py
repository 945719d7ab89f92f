"""arrowstate: stateful Structured Streaming operators with their state in Python.

    import arrowstate
    spark = arrowstate.configure(SparkSession.builder.master("local[2]")).getOrCreate()
"""
from __future__ import annotations

import os
import sys

from ._version import __version__
from .spark_home import SparkHomeError, check_pyspark, make_pyspark_importable

# pyspark from the pip wheel, else a distribution's (SPARK_HOME, through findspark), of the
# supported version (else SparkHomeError, an ImportError). Spark's jars are checked where
# the shim is built or handed to Spark (shim.find_spark), not in every Python worker.
make_pyspark_importable()
check_pyspark()

from .shim import jar_path  # noqa: E402

EXTENSION_CLASS = "org.apache.spark.sql.arrowstate.ArrowStateExtensions"
EXPLAIN_CLASS = "org.apache.spark.sql.arrowstate.ArrowStateExplainGenerator"

__all__ = ["configure", "jar_path", "EXTENSION_CLASS", "EXPLAIN_CLASS", "SparkHomeError",
           "__version__"]


def _append(existing: str | None, item: str) -> str:
    parts = [x for x in (existing or "").split(",") if x.strip()]
    if item not in parts:
        parts.append(item)
    return ",".join(parts)


def configure(builder):
    """Adds arrowstate to a SparkSession builder, keeping whatever the user set.

    Appends the shim jar to `spark.jars`, the extension to `spark.sql.extensions` and the
    explain provider that lists fallbacks to `spark.sql.extendedExplainProviders`.

    Python workers: a PySpark driver started from Python hands its executors the interpreter
    in PYSPARK_PYTHON, else `python3` (pyspark's `SparkContext.pythonExec`; there
    `spark.pyspark.python` only matters to spark-submit). When neither PYSPARK_PYTHON nor
    `spark.pyspark.python` is set, this sets PYSPARK_PYTHON to this interpreter in this
    process, so Spark's own Python workers and arrowstate's import the same packages (a
    virtual environment included); and it records the interpreter so chosen in
    `spark.arrowstate.pythonExec`, which arrowstate's state workers start with.
    """
    options = builder._options  # the builder keeps its settings here; it has no getter
    builder.config("spark.jars", _append(options.get("spark.jars"), jar_path()))
    builder.config("spark.sql.extensions",
                   _append(options.get("spark.sql.extensions"), EXTENSION_CLASS))
    builder.config("spark.sql.extendedExplainProviders",
                   _append(options.get("spark.sql.extendedExplainProviders"), EXPLAIN_CLASS))
    if "spark.pyspark.python" not in options and not os.environ.get("PYSPARK_PYTHON"):
        os.environ["PYSPARK_PYTHON"] = sys.executable
    builder.config("spark.arrowstate.pythonExec", os.environ.get("PYSPARK_PYTHON", "python3"))
    return builder
