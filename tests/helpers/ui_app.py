"""A Spark application with its UI on and an event log, for tests/spark/test_ui_metrics.py:
runs small arrowstate queries (deduplication and a windowed aggregation with a watermark, the
same without one, applyInPandasWithState) and the first also with Spark's own operators,
prints one JSON line (the UI's address, the application's id, its event log directory, each
query's run id and some custom metrics of its state operators in its last progress, None
where absent), then keeps the application up
until its standard input closes.

    python tests/helpers/ui_app.py WORKDIR
"""
import datetime as dt
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import pyarrow as pa  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import arrowstate  # noqa: E402
from harness import TEST_JAR_ENV, quick_local, run_query  # noqa: E402

SCHEMA = pa.schema([("user", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))])


def ev(user: str, second: int) -> dict:
    return {"user": user, "ts": dt.datetime.fromtimestamp(second, dt.timezone.utc)}


# duplicates in every batch; the third moves the watermark past the first windows (evicted,
# emitted) and brings a row later than it (dropped)
BATCHES = [[ev("a", 1), ev("a", 1), ev("b", 2), ev("c", 3)],
           [ev("a", 4), ev("b", 2), ev("d", 12)],
           [ev("e", 40), ev("a", 2), ev("e", 40), ev("f", 41)]]


def windowed(df):
    """Deduplication, then a count per user and 10-second window: both evict by watermark."""
    return (df.withWatermark("ts", "5 seconds").dropDuplicates(["user", "ts"])
            .groupBy(F.window("ts", "10 seconds"), "user").count())


def unwatermarked(df):
    """Deduplication, then a count per user: nothing is late, nothing evicted."""
    return df.dropDuplicates(["user", "ts"]).groupBy("user").count()


def count(key, pdfs, state):
    import pandas as pd

    n = sum(len(pdf) for pdf in pdfs) + (state.get[0] if state.exists else 0)
    if n >= 4:
        state.remove()
    else:
        state.update((n,))
    yield pd.DataFrame({"user": [key[0]], "n": [n]})


def per_user(df):
    from pyspark.sql.streaming.state import GroupStateTimeout

    return df.groupBy("user").applyInPandasWithState(
        count, "user string, n long", "n long", "Update", GroupStateTimeout.NoTimeout)


def last_state_operators(run) -> list:
    return run.custom[max(run.custom)] if run.custom else []


def main() -> None:
    workdir = sys.argv[1]
    events = os.path.join(workdir, "events")
    os.makedirs(events, exist_ok=True)
    builder = (quick_local(SparkSession.builder, os.environ[TEST_JAR_ENV])
               .master("local[2]").appName("arrowstate-ui-test")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.ui.enabled", "true")
               .config("spark.ui.port", "0")   # a free port: uiWebUrl says which
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.eventLog.enabled", "true")
               .config("spark.eventLog.dir", "file://" + events)
               .config("spark.sql.session.timeZone", "UTC"))
    spark = arrowstate.configure(builder).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    progress = {}
    names = ["pythonWorkerTimeMs", "arrowBytesToPython", "arrowBytesFromPython",
             "stateCacheHits", "loadedMapCacheHitCount", "stateOnCurrentVersionSizeBytes",
             "stateDiskBytes"]
    for name, build, mode, on in (("windowed", windowed, "append", True),
                                  ("windowed-spark", windowed, "append", False),
                                  ("unwatermarked", unwatermarked, "update", True),
                                  ("flatmap", per_user, "update", True)):
        run = run_query(spark, os.path.join(workdir, name), SCHEMA, BATCHES, build,
                        arrowstate=on, output_mode=mode, custom_metrics=names)
        progress[name] = {"runId": run.run_ids[-1], "customMetrics": last_state_operators(run)}
    print(json.dumps({"ui": spark.sparkContext.uiWebUrl,
                      "appId": spark.sparkContext.applicationId,
                      "eventLogDir": events, "progress": progress}), flush=True)
    sys.stdin.read()   # until the test is done with the live UI
    spark.stop()


if __name__ == "__main__":
    main()
