"""Two Spark Connect client sessions, each running applyInPandasWithState on the same
server (started by tests/spark/test_connect.py with arrowstate), and a query that leaves
arrowstate there. Prints one JSON line."""
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(__file__))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from pyspark import cloudpickle  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql.streaming.state import GroupStateTimeout  # noqa: E402

import fmgws_functions as fns  # noqa: E402
from harness import scratch_dir  # noqa: E402

cloudpickle.register_pickle_by_value(fns)


def run(spark, name, users):
    source = scratch_dir(f"connect-{name}-")
    query = (spark.readStream.schema("user string").option("maxFilesPerTrigger", 1)
             .parquet(source).groupBy("user")
             .applyInPandasWithState(fns.counts_reachable_state,
                                     "user string, own long, foreign long", "n long",
                                     "Update", GroupStateTimeout.NoTimeout)
             .writeStream.format("memory").queryName(f"out_{name}").outputMode("update")
             .option("checkpointLocation", scratch_dir("connect-ck-")).start())
    for i, batch in enumerate([users, users[:2]]):
        # written whole, then renamed in: the running query must not list a file half written
        partial = os.path.join(source, f".{i}.parquet.partial")
        pq.write_table(pa.table({"user": batch}), partial)
        os.replace(partial, os.path.join(source, f"{i}.parquet"))
        query.processAllAvailable()
    rows = [tuple(r) for r in spark.sql(f"select * from out_{name}").collect()]
    return query, rows


def leave(spark):
    """A deduplication run on arrowstate, then restarted with arrowstate switched off: the
    server's driver, which serves no Python driver, converts the state at planning. The
    rows written after each run, and what the checkpoint holds after."""
    source, checkpoint = scratch_dir("connect-leave-"), scratch_dir("connect-leave-ck-")
    out = os.path.join(scratch_dir("connect-leave-out-"), "rows")
    rows = []
    for i, (users, on) in enumerate([(["a", "b", "a"], True), (["a", "c"], False)]):
        spark.conf.set("spark.arrowstate.enabled", str(on).lower())
        partial = os.path.join(source, f".{i}.parquet.partial")
        pq.write_table(pa.table({"user": users}), partial)
        os.replace(partial, os.path.join(source, f"{i}.parquet"))
        query = (spark.readStream.schema("user string").parquet(source)
                 .dropDuplicates(["user"]).writeStream.format("parquet").option("path", out)
                 .option("checkpointLocation", checkpoint).start())
        query.processAllAvailable()
        query.stop()
        rows.append(sorted(r[0] for r in spark.read.parquet(out).collect()))
    return rows, sorted(os.listdir(checkpoint))


def main(url: str) -> None:
    alice = SparkSession.builder.remote(url).create()
    bob = SparkSession.builder.remote(url).create()
    alice_query, alice_rows = run(alice, "alice", [f"alice-{i}" for i in range(5)])
    bob_query, bob_rows = run(bob, "bob", [f"bob-{i}" for i in range(5)])
    # both queries still running: their state is loaded in the server's workers
    alice_query.stop()
    bob_query.stop()
    left, checkpoint = leave(alice)
    print(json.dumps({"alice": alice_rows, "bob": bob_rows, "left": left,
                      "checkpoint": checkpoint}))


if __name__ == "__main__":
    try:
        main(sys.argv[1])
    except BaseException:   # a failure ends the client at once (gRPC's threads would hold it)
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
