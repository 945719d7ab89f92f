"""arrowstate: stateful Structured Streaming operators with their state in Python.

    import arrowstate
    spark = arrowstate.configure(SparkSession.builder.master("local[2]")).getOrCreate()
"""
from __future__ import annotations

from ._version import __version__
from .spark_home import SparkHomeError, check_pyspark, make_pyspark_importable

# pyspark from the pip wheel, else a distribution's (SPARK_HOME, through findspark), of the
# supported version (else SparkHomeError, an ImportError). Spark's jars are checked where
# the shim is built or handed to Spark (shim.find_spark), not in every Python worker.
make_pyspark_importable()
check_pyspark()

from .shim import jar_path  # noqa: E402
from .session import EXPLAIN_CLASS, EXTENSION_CLASS, configure  # noqa: E402

__all__ = ["configure", "jar_path", "EXTENSION_CLASS", "EXPLAIN_CLASS", "SparkHomeError",
           "__version__"]

