"""Two Spark Connect client sessions, each running applyInPandasWithState on the same
server (started by tests/spark/test_connect.py with arrowstate). Prints one JSON line."""
import json
import os
import sys

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


def main(url: str) -> None:
    alice = SparkSession.builder.remote(url).create()
    bob = SparkSession.builder.remote(url).create()
    alice_query, alice_rows = run(alice, "alice", [f"alice-{i}" for i in range(5)])
    bob_query, bob_rows = run(bob, "bob", [f"bob-{i}" for i in range(5)])
    # both queries still running: their state is loaded in the server's workers
    alice_query.stop()
    bob_query.stop()
    print(json.dumps({"alice": alice_rows, "bob": bob_rows}))


if __name__ == "__main__":
    main(sys.argv[1])
