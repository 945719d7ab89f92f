"""What a micro-batch costs on an object store (the S3-compatible server of
tests/helpers/storage.py, through `s3a://`): an aggregation (every family writes its state
files alike) by arrowstate against Spark's HDFS-backed store,
the cheapest of Spark's, on the same query and micro-batches. Per steady micro-batch no more
requests of any type (arrowstate writes a state file in place, one PUT, where Spark's
checkpoint file manager renames a temporary object: fewer PUTs, no COPY, DELETE or LIST
for its state), bytes uploaded within 1.5x, and no S3A client made after the first
batch (one per executor and checkpoint, kept for the executor's life as Spark's stores keep
theirs; one per task and batch would be a client, its threads and its connection pool each
time)."""
import os
import shutil
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import storage

pytestmark = pytest.mark.slow

BATCHES, ROWS = 3, 600


def _count_and_sum(df):
    from pyspark.sql import functions as F
    return df.groupBy("key").agg(F.count("*").alias("n"), F.sum("value").alias("total"))




def _inputs(directory) -> list[str]:
    rng = np.random.default_rng(5)
    paths = []
    for b in range(BATCHES):
        path = os.path.join(directory, f"{b:03d}.parquet")
        pq.write_table(pa.table({"key": rng.integers(0, 5000, ROWS),
                                 "value": rng.random(ROWS)}), path)
        paths.append(path)
    return paths


def _run(spark, store, build, mode, inputs, tmp_path, arrowstate: bool):
    """Per-batch traffic of one run, and the S3A clients made after its first batch."""
    spark.conf.set("spark.arrowstate.enabled", str(arrowstate).lower())
    source = tmp_path / f"source-{arrowstate}"
    source.mkdir()
    stream = (spark.readStream.schema("key long, value double")
              .option("maxFilesPerTrigger", 1).parquet(str(source)))
    q = (build(stream).writeStream.format("noop").outputMode(mode)
         .option("checkpointLocation", store.uri(f"costs/{uuid.uuid4().hex}/ck")).start())
    try:
        first = storage.traffic_per_batch(store, q, inputs[:1], str(source))
        clients = storage.s3a_clients(spark)
        later = storage.traffic_per_batch(store, q, inputs[1:], str(source))
        assert q.exception() is None and clients   # the count sees the clients there are
        return first + later, {n for n in storage.s3a_clients(spark) if n > max(clients)}
    finally:
        q.stop()
        shutil.rmtree(source, ignore_errors=True)


@pytest.mark.parametrize("remote_checkpoints", ["s3"], indirect=True)
def test_a_micro_batch_costs_what_sparks_cheapest_store_costs(spark, remote_checkpoints,
                                                              tmp_path):
    build, mode = _count_and_sum, "update"
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    inputs = _inputs(tmp_path)
    native, _ = _run(spark, remote_checkpoints, build, mode, inputs, tmp_path, False)
    ours, clients_made = _run(spark, remote_checkpoints, build, mode, inputs, tmp_path, True)
    native_steady, our_steady = storage.steady_traffic(native), storage.steady_traffic(ours)
    requests = {k for k in native_steady.keys() | our_steady.keys() if k != "bytes_received"}
    more = {k: (our_steady.get(k, 0), native_steady.get(k, 0)) for k in requests
            if our_steady.get(k, 0) > native_steady.get(k, 0)}
    assert not more, f"requests per micro-batch (arrowstate, Spark) where ours are more: {more}"
    assert our_steady.get("COPY", 0) < native_steady["COPY"], (our_steady, native_steady)
    assert our_steady["bytes_received"] <= 1.5 * native_steady["bytes_received"], (
        our_steady, native_steady)
    assert not clients_made, f"S3A clients made after the first batch: {clients_made}"
