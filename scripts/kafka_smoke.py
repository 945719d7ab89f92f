"""Kafka in, Kafka out, in real-time mode: a smoke run of tests/helpers/kafka.py.

Starts a broker, topics `in` (5 partitions) and `out`, and a local Spark session with Spark's
Kafka connector; runs `in` -> query -> `out` under trigger(realTime=...) while records are
produced at a steady rate, and prints the end-to-end latencies (produced -> read back from
`out`). The query is stateless (key, value), or with --stateful a transformWithStateInPandas
count per key on arrowstate.

    PYTHONPATH=python python scripts/kafka_smoke.py [--stateful] [--records 200 --rate 100]
        [--trigger "5 seconds"] [--conf KEY=VALUE ...] [--json result.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "helpers"))

import kafka  # noqa: E402  (tests/helpers, put on the path above)
from latency import latency_summary  # noqa: E402

SOURCE_PARTITIONS, SHUFFLE_PARTITIONS = 5, 2


def session(stateful: bool, conf: dict[str, str]):
    from pyspark.sql import SparkSession
    builder = (SparkSession.builder.appName("arrowstate-kafka-smoke")
               # a real-time query holds a task slot per partition of every stage at once:
               # 5 source partitions, 2 shuffle partitions, one spare
               .master(f"local[{SOURCE_PARTITIONS + SHUFFLE_PARTITIONS + 1}]")
               .config("spark.jars", ",".join(kafka.connector_jars()))
               .config("spark.sql.shuffle.partitions", SHUFFLE_PARTITIONS)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false"))
    if stateful:
        import arrowstate
        builder = arrowstate.configure(builder.config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def stateless(df):
    return df.selectExpr("key", "value")


def stateful(df):
    import pandas as pd
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor
    # the field's name, captured by value: the Python workers cannot import tests/helpers
    produced = kafka.PRODUCED_AT

    class CountPerKey(StatefulProcessor):
        """Per input row, the key's count so far, with the row's send time."""

        def init(self, handle):
            self.count = handle.getValueState("count", "n long")

        def handleInputRows(self, key, rows, timerValues):
            n = self.count.get()[0] if self.count.exists() else 0
            frame = pd.concat(list(rows)).sort_values("seq")
            ns = list(range(n + 1, n + 1 + len(frame)))
            self.count.update((ns[-1],))
            yield pd.DataFrame({"key": key[0], "seq": frame["seq"].values,
                                produced: frame[produced].values, "n": ns})

    fields = F.from_json(F.col("value").cast("string"),
                         f"seq long, {kafka.PRODUCED_AT} long")
    parsed = df.select(F.col("key").cast("string").alias("key"), fields.alias("v")) \
        .select("key", "v.*")
    out = parsed.groupBy("key").transformWithStateInPandas(
        CountPerKey(), f"key string, seq long, {kafka.PRODUCED_AT} long, n long",
        "Update", "None")
    return out.select("key", F.to_json(F.struct("seq", kafka.PRODUCED_AT, "n")).alias("value"))


def run(stateful_query: bool, records: int, rate: float, trigger: str,
        conf: dict[str, str] | None = None) -> dict:
    """The query over `records` records sent at `rate` a second (after a warm-up whose
    records, keyed `warmup<i>`, are left out): what reached `in` and `out` (Arrivals as
    dicts), the latencies in `out` and the times taken; `conf`: more session settings."""
    started = time.monotonic()
    times = {}
    with kafka.KafkaBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        broker.create_topic("in", SOURCE_PARTITIONS)
        broker.create_topic("out", 1)
        times["broker_s"] = time.monotonic() - started
        spark = session(stateful_query, conf or {})
        source = (spark.readStream.format("kafka")
                  .option("kafka.bootstrap.servers", broker.bootstrap)
                  .option("subscribe", "in").option("startingOffsets", "earliest").load())
        query = ((stateful if stateful_query else stateless)(source).writeStream
                 .format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
                 .option("topic", "out").option("checkpointLocation", os.path.join(tmp, "ck"))
                 .outputMode("update").trigger(realTime=trigger).start())
        measured = lambda a: not a.key.startswith("warmup")   # noqa: E731
        with kafka.TopicRecorder(broker.bootstrap, "in") as sent_in, \
                kafka.TopicRecorder(broker.bootstrap, "out") as out:
            # warm-up: records until one comes back, so that the query's tasks are running
            t0 = time.monotonic()
            with kafka.PacedProducer(broker.bootstrap, "in", 5,
                                     make_key=lambda i: f"warmup{i}"):
                out.wait_for(1, 120, query.exception)
            times["query_answering_s"] = time.monotonic() - t0
            sent = kafka.produce_paced(broker.bootstrap, "in", rate, records / rate)
            back = out.wait_for(sent, 60, query.exception, where=measured)
            inputs = sent_in.wait_for(sent, 10, where=measured)
        # stopping cancels the running batch's tasks, whose Kafka clients log the interrupt
        # as errors: not this run's failures
        spark.sparkContext.setLogLevel("OFF")
        query.stop()
        spark.stop()
    times["total_s"] = time.monotonic() - started
    return {"sent": sent, "in": [dataclasses.asdict(a) for a in inputs],
            "out": [dataclasses.asdict(a) for a in back],
            "latency_ms": latency_summary([a.latency_ms() for a in back]),
            "times": times}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stateful", action="store_true")
    ap.add_argument("--records", type=int, default=200)
    ap.add_argument("--rate", type=float, default=100, help="records a second")
    ap.add_argument("--trigger", default="5 seconds")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a session setting (repeatable)")
    ap.add_argument("--json", help="also write the result (run()'s) to this file")
    args = ap.parse_args()
    result = run(args.stateful, args.records, args.rate, args.trigger,
                 dict(c.split("=", 1) for c in args.conf))
    if args.json:
        Path(args.json).write_text(json.dumps(result))
    print(f"{result['sent']} records at {args.rate:g}/s, {len(result['out'])} back from "
          f"`out` ({'stateful' if args.stateful else 'stateless'}, trigger {args.trigger}): "
          f"latency ms {result['latency_ms']}; "
          + ", ".join(f"{k} {v:.1f}" for k, v in result["times"].items()))


if __name__ == "__main__":
    main()
