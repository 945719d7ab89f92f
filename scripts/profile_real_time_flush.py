"""One real-time flush of transformWithStateInPandas (or, with --rows, transformWithState's
Row API) in the worker, without Spark: the family driven in-process (as
tests/helpers/family_tasks.py drives families) with flushes of --keys rows of as many keys,
the bench's workload (a ValueState read and updated, one output row per input row). Prints
the time a flush takes, then cProfile's top functions.

    python scripts/profile_real_time_flush.py [--keys 12] [--flushes 500] [--rows]
"""
import argparse
import base64
import cProfile
import os
import pstats
import sys
import time

import pyarrow as pa

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "helpers"))

OUTPUT = ('{"type":"struct","fields":[{"name":"key","type":"string","nullable":true,'
          '"metadata":{}},{"name":"seq","type":"long","nullable":true,'
          '"metadata":{}},{"name":"count","type":"long","nullable":true,"metadata":{}}]}')


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=12, help="rows (each its own key) a flush")
    parser.add_argument("--flushes", type=int, default=500)
    parser.add_argument("--rows", action="store_true",
                        help="the Row API (transformWithState), not the pandas API")
    args = parser.parse_args()
    from pyspark.serializers import CloudPickleSerializer
    from pyspark.sql.streaming.stateful_processor_util import \
        TransformWithStateInPandasUdfUtils

    import family_tasks
    from arrowstate.families import TransformWithState
    from bench_lib.functions import PandasLatencyCount, RowLatencyCount

    schema = pa.schema([("key", pa.string()), ("key_", pa.string()),
                        ("seq", pa.int64())])
    processor = RowLatencyCount() if args.rows else PandasLatencyCount()
    udf = TransformWithStateInPandasUdfUtils(processor, "None").transformWithStateUDF
    operator = {
        "command": base64.b64encode(CloudPickleSerializer().dumps((udf, None))).decode(),
        "pythonIncludes": [], "keyIndices": [0], "valueIndices": [1, 2], "pandas": not args.rows,
        "maxRecordsPerBatch": 10000, # the variable's schema as the JVM parses the DDL "n long"
        "variables": {"count": {"value": '{"type":"struct","fields":[{"name":"n",'
                                          '"type":"long","nullable":true,"metadata":{}}]}',
                                "userKey": None}},
        "runnerConf": {"spark.sql.session.timeZone": "UTC"}, "timeMode": "None",
        "realTime": True, "inputSorted": False, "outputSchema": OUTPUT}
    family, state = family_tasks.task(TransformWithState, operator, schema)
    k = args.keys

    def flush(i):
        keys = [f"k{(i * k + j) * 7919 % 50000}" for j in range(k)]
        return pa.record_batch([pa.array(keys), pa.array(keys),
                                pa.array(range(k), pa.int64())], schema=schema)

    for i in range(100):   # warm
        family.process(state, flush(i))
    start = time.perf_counter()
    for i in range(args.flushes):
        family.process(state, flush(i))
    per_flush_ms = (time.perf_counter() - start) / args.flushes * 1000
    print(f"{'Row' if args.rows else 'pandas'} API, {k} rows a flush: {per_flush_ms:.2f} ms "
          "a flush")
    profile = cProfile.Profile()
    profile.enable()
    for i in range(args.flushes):
        family.process(state, flush(i))
    profile.disable()
    pstats.Stats(profile).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
