"""Adding arrowstate to a SparkSession builder (`arrowstate.configure`): the shim jar, the
extension and the EXPLAIN provider, and the executors' Python where Spark's choice would be
wrong."""
from __future__ import annotations

import os
import re
import shlex
import sys

from .shim import jar_path

EXTENSION_CLASS = "org.apache.spark.sql.arrowstate.ArrowStateExtensions"
EXPLAIN_CLASS = "org.apache.spark.sql.arrowstate.ArrowStateExplainGenerator"

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
    `spark.pyspark.python` only matters to spark-submit). With a local master (`local`,
    `local[...]`, `local-cluster[...]`: executors on this machine), when neither
    PYSPARK_PYTHON nor `spark.pyspark.python` is set, this sets PYSPARK_PYTHON to this
    interpreter in this process, so Spark's own Python workers and arrowstate's import the
    same packages (a virtual environment included). Any other master runs executors on
    machines where this interpreter's path may not exist: Spark's own choice stays. The
    interpreter chosen is recorded in `spark.arrowstate.pythonExec` (unless the user set
    it), which arrowstate's state workers start with; with none (a cluster, PYSPARK_PYTHON
    unset) they start the executor's `spark.pyspark.python`, else PYSPARK_PYTHON, else
    `python3`.
    """
    options = builder._options  # the builder keeps its settings here; it has no getter
    builder.config("spark.jars", _append(options.get("spark.jars"), jar_path()))
    builder.config("spark.sql.extensions",
                   _append(options.get("spark.sql.extensions"), EXTENSION_CLASS))
    builder.config("spark.sql.extendedExplainProviders",
                   _append(options.get("spark.sql.extendedExplainProviders"), EXPLAIN_CLASS))
    if _LOCAL_MASTER.fullmatch(_master(options)):
        if "spark.pyspark.python" not in options and not os.environ.get("PYSPARK_PYTHON"):
            os.environ["PYSPARK_PYTHON"] = sys.executable
        python = os.environ.get("PYSPARK_PYTHON", "python3")
    else:
        python = os.environ.get("PYSPARK_PYTHON")
    if python and "spark.arrowstate.pythonExec" not in options:
        builder.config("spark.arrowstate.pythonExec", python)
    return builder


# masters whose executors run on this machine
_LOCAL_MASTER = re.compile(r"local(\[.*\])?|local-cluster\[.*\]")


def _master(options: dict) -> str:
    """The master the builder's session gets: its own (`spark.master`, or a Spark Connect
    `spark.remote`), else a running context's, else what pyspark's launcher gives it
    (spark-submit's `--master` or `--conf` in PYSPARK_SUBMIT_ARGS, `spark.master` in
    spark-defaults.conf, the MASTER variable), else spark-submit's default, `local[*]`."""
    for key in ("spark.master", "spark.remote"):
        if options.get(key):
            return str(options[key])
    if os.environ.get("SPARK_REMOTE"):
        return os.environ["SPARK_REMOTE"]
    from pyspark import SparkContext

    running = SparkContext._active_spark_context
    if running is not None:
        return running.master
    args = shlex.split(os.environ.get("PYSPARK_SUBMIT_ARGS", ""))
    pairs = list(zip(args, args[1:]))
    given = [v for flag, v in pairs if flag == "--master"] + [
        a.split("=", 1)[1] for a in args if a.startswith("--master=")]
    conf = [v.split("=", 1)[1] for flag, v in pairs
            if flag == "--conf" and v.startswith("spark.master=")]
    if given or conf:   # spark-submit's --master wins over a --conf
        return (given or conf)[-1]
    return _defaults_file_master() or os.environ.get("MASTER") or "local[*]"


def _defaults_file_master() -> str | None:
    """`spark.master` in the spark-defaults.conf spark-submit reads, if any."""
    from pyspark.find_spark_home import _find_spark_home

    conf_dir = os.environ.get("SPARK_CONF_DIR") or os.path.join(
        os.environ.get("SPARK_HOME") or _find_spark_home(), "conf")
    try:
        with open(os.path.join(conf_dir, "spark-defaults.conf"), encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found = [m.group(1) for m in (
        re.fullmatch(r"\s*spark\.master\s*[=:\s]\s*(\S+)\s*", line) for line in lines) if m]
    return found[-1] if found else None   # as in a properties file, the last one counts
