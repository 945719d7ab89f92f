"""Real-time mode where arrowstate could not add its nodes to Spark's real-time allowlist (the
registration made to fail, as without access to sun.misc.Unsafe, by a test-only system
property on the driver): every real-time stateful operator stays Spark's, with the reason
in EXPLAIN, and Spark's own real-time queries run as without arrowstate. Started by
tests/spark/test_real_time.py; prints one JSON line with what it saw."""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

from pyspark import cloudpickle  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

import arrowstate  # noqa: E402
import real_time as rt  # noqa: E402
from harness import TEST_JAR_ENV, quick_local, scratch_dir  # noqa: E402

cloudpickle.register_pickle_by_value(rt)

FAIL_REGISTRATION = "arrowstate.test.failAllowlistRegistration"
PARTS = [[("a", 1), ("b", 2), ("a", 3)], [("c", 4), ("a", 5)]]


def session():
    builder = (quick_local(SparkSession.builder, os.environ[TEST_JAR_ENV],
                           f"-D{FAIL_REGISTRATION}=true")
               # a real-time stage group holds a slot per partition of every stage at once
               .master("local[2,3]").appName("arrowstate-allowlist-refused-test")
               .config("spark.sql.shuffle.partitions", "1")
               .config("spark.sql.streaming.realTimeMode.minBatchDuration", "500")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.session.timeZone", "UTC"))
    spark = arrowstate.configure(builder).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _wait(predicate, timeout=90):
    deadline = time.time() + timeout
    while not predicate() and time.time() < deadline:
        time.sleep(0.05)


def run(spark, workdir, name, build, arrowstate_on, outputs):
    """The query under Trigger.RealTime over PARTS: the sink's rows, EXPLAIN and the error."""
    spark.conf.set("spark.arrowstate.enabled", str(arrowstate_on).lower())
    source = rt.LowLatencySource(spark)
    sink = rt.RecordingSink(os.path.join(workdir, f"{name}.jsonl"))
    query = (sink.writer(build(source.df)).outputMode("update")
             .trigger(realTime="1 second")
             .option("checkpointLocation", os.path.join(workdir, name)).start())
    sent = 0
    for part in PARTS:
        source.add(part)
        sent += len(part)
        expected = outputs([row for p in PARTS for row in p][:sent])
        _wait(lambda: len(sink.rows()) >= expected or query.exception() is not None)
    # a batch commits at its end
    _wait(lambda: sum(p["numInputRows"] for p in query.recentProgress) >= sent
          or query.exception() is not None)
    plan = query._jsq.explainInternal(False) if query.exception() is None else ""
    error = query.exception()
    query.stop()
    spark.conf.set("spark.arrowstate.enabled", "true")
    return sorted((r["user"], r["v"]) for r in sink.rows()), plan, (
        None if error is None else str(error))


def main() -> None:
    seen = {}
    workdir = scratch_dir("arrowstate-allowlist-")
    spark = session()
    jvm = spark._jvm
    allowlist = jvm.org.apache.spark.sql.arrowstate.planning.RealTimeAllowlist
    seen["allowlist_holds"] = [allowlist.holds(name) for name in
                               jvm.scala.jdk.javaapi.CollectionConverters.asJava(
                                   allowlist.operators())]

    # 1. dropDuplicates: Spark's own real-time deduplication, arrowstate on and off
    def dedup(df):
        return df.dropDuplicates(["user"])

    def firsts(sent):
        return len({user for user, _ in sent})

    rows, plan, error = run(spark, workdir, "dedup", dedup, True, firsts)
    spark_rows, _, spark_error = run(spark, workdir, "dedup-spark", dedup, False, firsts)
    seen.update(dedup_rows=rows, dedup_error=error, dedup_plan=plan,
                dedup_spark_rows=spark_rows, dedup_spark_error=spark_error)

    # 2. applyInPandasWithState, which Spark does not run in real-time mode: its own error,
    #    as without arrowstate
    def by_user(df):
        return df.groupBy("user").applyInPandasWithState(
            rt.running_total, rt.OUTPUT, "n long, total long", "update", "NoTimeout")

    _, _, error = run(spark, workdir, "fmgws", by_user, True, len)
    _, _, spark_error = run(spark, workdir, "fmgws-spark", by_user, False, len)
    seen.update(function_error=error, function_spark_error=spark_error)
    spark.stop()
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
