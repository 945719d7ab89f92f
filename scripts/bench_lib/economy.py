"""What a micro-batch costs on the checkpoint's storage (`--economy`): per steady micro-batch
and per shuffle partition, the object store's requests by type (GET, PUT, HEAD, LIST, COPY,
DELETE...) and the bytes uploaded to it, for each family, with arrowstate on and with Spark's
own stores on the same server: the HDFS-backed store (Spark's default) and RocksDB with
changelog checkpointing (transformWithState runs on RocksDB only). Beside them, the same
stream with no state at all (a projection into the same sink): the offset and commit logs
every query writes, which no state store can save.

The query runs with its default trigger; the bench drops one input file at a time into the
source directory (local) and waits for the batch (processAllAvailable), reading the store's
counters between batches. The first batch (directories, metadata, schema files) is reported
apart; steady figures are medians over the others. After the run the checkpoint's state
files are listed through Hadoop's filesystem: how many each engine keeps, and their bytes.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
# case -> the families' bench cases (bench.CASES) it runs; transformWithState has no
# HDFS-backed form
ECONOMY_CASES = ("dedup", "dedup_watermark", "agg_update", "agg_append",
                 "session_window_append", "apply_in_pandas_with_state",
                 "tws_pandas_value_count")
STATELESS = (lambda df: df.select("key", "value"), "append", None)


def _engines(node: str | None) -> list[str]:
    if node is None:
        return ["stateless"]
    spark_stores = ["rocksdb_changelog"] if node == "ArrowTransformWithState" else [
        "hdfs_backed", "rocksdb_changelog"]
    return ["arrowstate", *spark_stores]


def set_engine(spark, engine: str) -> None:
    """arrowstate, or Spark's operators on `hdfs_backed` or `rocksdb_changelog` (RocksDB with
    changelog checkpointing)."""
    spark.conf.set("spark.arrowstate.enabled", str(engine == "arrowstate").lower())
    if engine == "rocksdb_changelog":
        spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
        spark.conf.set(CHANGELOG, "true")
    else:
        spark.conf.unset("spark.sql.streaming.stateStore.providerClass")
        spark.conf.unset(CHANGELOG)


def _state_files(spark, checkpoint: str) -> dict:
    """The state files under `checkpoint`/state (Spark's metadata left out): count and
    bytes."""
    from bench_lib.checkpoints import state_files
    kept = [size for path, size in state_files(spark, checkpoint).items()
            if not ("/_metadata/" in path or "/_stateSchema/" in path or path.endswith(".crc"))]
    return {"files": len(kept), "bytes": sum(kept)}


def _measure(spark, checkpoints, inputs: list[str], case, engine: str) -> dict:
    """One run of `case` on `engine` over `inputs`, a file a batch: per-batch requests and
    uploaded bytes (first batch, and the median of the others), and the state files kept."""
    from storage import steady_traffic, traffic_per_batch   # tests/helpers, on bench's path

    build, mode, _node = case
    set_engine(spark, engine)
    source = tempfile.mkdtemp(prefix="bench-economy-in-")
    checkpoint = checkpoints.new()
    try:
        stream = (spark.readStream.schema("key long, user string, ts timestamp, value double")
                  .option("maxFilesPerTrigger", 1).parquet(source))
        q = (build(stream).writeStream.format("noop").outputMode(mode)
             .option("checkpointLocation", checkpoint).start())
        try:
            per_batch = traffic_per_batch(checkpoints.store, q, inputs, source)
        finally:
            q.stop()
        kept = _state_files(spark, checkpoint)
    finally:
        shutil.rmtree(source, ignore_errors=True)
        checkpoints.remove(checkpoint)
    return {"first_batch": dict(sorted(per_batch[0].items())),
            "steady_batch": steady_traffic(per_batch),
            "state_files_kept": kept}


def economy(spark, args, cases: dict, checkpoints, write_batches) -> list[dict]:
    """Per case and engine, what a micro-batch costs on the checkpoint's store: one JSON
    line each, with the stateless stream's figures for the same batches beside them."""
    if checkpoints.kind != "s3":
        raise SystemExit("--economy counts an object store's requests: use --checkpoint s3")
    source = tempfile.mkdtemp(prefix="bench-economy-")
    write_batches(source, args.economy_rows * args.economy_batches, args.economy_batches,
                  args.keys)
    inputs = sorted(os.path.join(source, f) for f in os.listdir(source))
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    names = args.cases.split(",")
    results = []
    try:
        baseline = _measure(spark, checkpoints, inputs, STATELESS, "stateless")
        print(json.dumps({"case": "stateless", "partitions": partitions, **baseline}),
              flush=True)
        for name in names:
            case = cases[name]
            for engine in _engines(case[2]):
                figures = _measure(spark, checkpoints, inputs, case, engine)
                steady = figures["steady_batch"]
                state_requests = {
                    k: round(v - baseline["steady_batch"].get(k, 0), 1)
                    for k, v in steady.items() if not k.startswith("bytes")}
                line = {"case": name, "engine": engine, "partitions": partitions,
                        "rows_per_batch": args.economy_rows, **figures,
                        "state_requests_per_batch": state_requests,
                        "state_requests_per_partition_batch": {
                            k: round(v / partitions, 2) for k, v in state_requests.items()},
                        "bytes_uploaded_per_partition_batch": round(
                            (steady.get("bytes_received", 0)
                             - baseline["steady_batch"].get("bytes_received", 0))
                            / partitions)}
                print(json.dumps(line), flush=True)
                results.append(line)
    finally:
        spark.conf.set("spark.arrowstate.enabled", "true")
        spark.conf.unset("spark.sql.streaming.stateStore.providerClass")
        spark.conf.unset(CHANGELOG)
        shutil.rmtree(source, ignore_errors=True)
    return results
