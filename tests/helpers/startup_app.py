"""Worker start-up in processes of their own: a Spark started under `SPARK_TESTING` (as
Spark's own suites run it), and a worker that cannot start. Started by
tests/spark/test_workers.py; prints one JSON line with what it saw."""
import datetime as dt
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import pyarrow as pa  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

import arrowstate  # noqa: E402
from harness import (TEST_JAR_ENV, _as_text, quick_local, run_query, scratch_dir,  # noqa: E402
                     spark_errors)

SCHEMA = pa.schema([("user", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))])
BATCHES = [[{"user": u, "ts": dt.datetime.fromtimestamp(i, dt.timezone.utc)}
            for i, u in enumerate(users)] for users in (["a", "b", "a"], ["b", "c"])]


def session(**settings):
    builder = (quick_local(SparkSession.builder, os.environ[TEST_JAR_ENV])
               .master("local[2]").appName("arrowstate-startup-test")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.session.timeZone", "UTC"))
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = arrowstate.configure(builder).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def count(key, pdfs, state):
    import pandas as pd

    n = sum(len(pdf) for pdf in pdfs) + (state.get[0] if state.exists else 0)
    state.update((n,))
    yield pd.DataFrame({"user": [key[0]], "n": [n]})


def by_user(df):
    from pyspark.sql.streaming.state import GroupStateTimeout

    return df.groupBy("user").applyInPandasWithState(
        count, "user string, n long", "n long", "Update", GroupStateTimeout.NoTimeout)


ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def tws_count(df):
    import tws_processors
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(tws_processors)
    return df.groupBy("user").transformWithStateInPandas(
        tws_processors.RunningCount(), "user string, count long", "Update", "None")


def main() -> None:
    seen = {}
    workdir = scratch_dir("arrowstate-startup-")

    # 1. Spark's test mode: pyspark's worker modules load only in a marked Python worker.
    os.environ["SPARK_TESTING"] = "1"
    spark = session()
    for name, build, mode in (("dedup", lambda df: df.dropDuplicates(["user"]), "append"),
                              ("flatmap", by_user, "update")):
        off = run_query(spark, workdir, SCHEMA, BATCHES, build, arrowstate=False,
                        output_mode=mode)
        on = run_query(spark, workdir, SCHEMA, BATCHES, build, arrowstate=True,
                       output_mode=mode)
        seen[f"spark_testing_{name}_same"] = _as_text(on.outputs) == _as_text(off.outputs)
    spark.stop()
    del os.environ["SPARK_TESTING"]

    # 2. A function's worker that cannot start (an address-space limit below what importing
    #    pandas needs): the task's error says why, not only that the worker exited.
    spark = session(**{"spark.executor.pyspark.memory": "64m"})
    try:
        run_query(spark, workdir, SCHEMA, BATCHES, by_user, arrowstate=True,
                  output_mode="update")
        seen["cannot_start_error"] = None
    except Exception as e:   # noqa: BLE001 - the error's text is what is checked
        text = str(e)
        seen["cannot_start_error"] = text[text.find("the Python state worker"):][:4000]
        seen["cannot_start_conditions"] = spark_errors(e)
    spark.stop()

    # 3. Python workers over Unix domain sockets (spark.python.unix.domain.socket.enabled):
    #    the state workers, a function's workers, and transformWithState's init() while the
    #    driver plans (in a forked worker, against Spark's state server on a socket path)
    spark = session(**{"spark.python.unix.domain.socket.enabled": "true"})
    for name, build, mode in (("dedup", lambda df: df.dropDuplicates(["user"]), "append"),
                              ("flatmap", by_user, "update"), ("tws", tws_count, "update")):
        if name == "tws":   # Spark runs transformWithState on RocksDB only
            spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
        off = run_query(spark, workdir, SCHEMA, BATCHES, build, arrowstate=False,
                        output_mode=mode)
        on = run_query(spark, workdir, SCHEMA, BATCHES, build, arrowstate=True,
                       output_mode=mode)
        seen[f"unix_socket_{name}_same"] = (_as_text(on.outputs) == _as_text(off.outputs)
                                            and bool(off.outputs))
    spark.stop()
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
