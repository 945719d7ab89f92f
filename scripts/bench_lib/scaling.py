"""bench.py --scaling: state beyond memory. A query keeping state per key (update mode: a
count and sum per key, by default) over batches of new keys, arrowstate under a memory
budget against Spark on its RocksDB store (changelog checkpointing on) in one process, the
engines alternating, the checkpoint where --checkpoint says: each batch's time, the peak
resident memory of the state workers and the JVM, the files and bytes each batch writes
under the checkpoint's state/, the object store's requests a batch, the time to restart at
the last version, and whether every batch's output was the same (see bench.py's
docstring)."""
from __future__ import annotations

import glob
import json
import os
import shutil
import statistics
import tempfile
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def write_scaling_batches(directory: str, state_keys: int, batch_rows: int,
                          seed: int = 11) -> int:
    """Batches of `batch_rows` new keys each (in random order) until `state_keys` keys
    exist; how many batches."""
    rng = np.random.default_rng(seed)
    batches = max(1, state_keys // batch_rows)
    for b in range(batches):
        keys = rng.permutation(batch_rows).astype(np.int64) + b * batch_rows
        table = pa.table({"key": pa.array(keys), "value": pa.array(rng.random(batch_rows))})
        pq.write_table(table, os.path.join(directory, f"{b:05d}.parquet"))
    return batches


class PeakRss:
    """Samples the resident memory of arrowstate's state workers and of Spark's JVM (this
    process's child) every `interval` seconds while it runs: each one's peak."""

    def __init__(self, interval: float = 0.2) -> None:
        from procinfo import own_state_worker_pids, parent_pid, rss_bytes
        self.workers: dict[int, int] = {}
        self.jvm = 0
        self._stop = threading.Event()

        def sample():
            jvms = [pid for pid in map(int, (p.split("/")[2] for p in glob.glob("/proc/[0-9]*")))
                    if parent_pid(pid) == os.getpid()]   # Spark's JVM is our child
            while not self._stop.wait(interval):
                for pid in own_state_worker_pids():
                    self.workers[pid] = max(self.workers.get(pid, 0), rss_bytes(pid))
                self.jvm = max([self.jvm] + [rss_bytes(pid) for pid in jvms])

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        return {"worker_rss_peak_mb": round(max(self.workers.values(), default=0) / 2**20),
                "workers": len(self.workers), "jvm_rss_peak_mb": round(self.jvm / 2**20)}


def scaling_run(spark, source: str, arrowstate: bool, case,
                checkpoints) -> tuple[list, dict, dict]:
    """The case's query (`(build, node)`: the query on a stream of key and value, and the
    arrowstate node it plans) in update mode over every file of `source`, arrowstate on or
    Spark's operators on its RocksDB store with changelog checkpointing (Spark's cheapest
    checkpoint for a large state), its checkpoint where
    `checkpoints` (bench_lib/checkpoints.py) puts it: each batch's duration (ms), a
    checksum of each batch's output (row count and a sum of row hashes: equal outputs,
    equal sums), the peak resident memory, the files and bytes each batch wrote under the
    checkpoint's `state/`, on an object store its requests a batch, and the time to restart
    at the last version (`_restart_ms`)."""
    from bench_lib.checkpoints import per_batch, state_files, written_between
    from bench_lib.economy import set_engine
    build, node = case
    from pyspark.sql import functions as F
    set_engine(spark, "arrowstate" if arrowstate else "rocksdb_changelog")
    checksums = {}
    checkpoint = checkpoints.new()
    listings = []   # the state's files as each batch starts (the previous batch committed)

    def checksum(df, batch_id):
        listings.append(state_files(spark, checkpoint))
        row = df.agg(F.count("*").alias("n"), F.sum(F.xxhash64(*df.columns)
                                                     .cast("decimal(38,0)")).alias("h")).first()
        checksums[batch_id] = (row["n"], str(row["h"]))

    requests_before = checkpoints.requests()
    peak = PeakRss()
    try:
        stream = (spark.readStream.schema("key long, value double")
                  .option("maxFilesPerTrigger", 1).parquet(source))
        q = (build(stream).writeStream.foreachBatch(checksum).outputMode("update")
             .trigger(availableNow=True).option("checkpointLocation", checkpoint).start())
        q.awaitTermination()
        assert (node in q._jsq.explainInternal(False)) == arrowstate
        progress = [p for p in q.recentProgress if p["numInputRows"] > 0]
        durations = [p["durationMs"]["triggerExecution"] for p in progress]
        memory = peak.stop()
        if arrowstate:   # the time tasks waited on the state workers (summed over tasks)
            memory["python_worker_ms"] = [
                p["stateOperators"][0]["customMetrics"].get("pythonWorkerTimeMs")
                for p in progress]
        requests = per_batch(requests_before, checkpoints.requests(), len(progress))
        if requests:
            memory["store_requests_per_batch"] = requests
        # what each batch wrote under state/: its commit, and snapshots (uploaded by
        # maintenance, off the batch's path) counted with the batch whose listing saw them;
        # the listing itself costs a LIST or two a batch on an object store, in both engines
        listings.append(state_files(spark, checkpoint))
        written = [written_between(a, b) for a, b in zip(listings, listings[1:])]
        memory["state_files_written"] = [n for n, _ in written]
        memory["state_bytes_written"] = [size for _, size in written]
        memory["restart_ms"] = _restart_ms(spark, source, build, checkpoint, arrowstate)
        return durations, checksums, memory
    finally:
        peak.stop()
        checkpoints.remove(checkpoint)


def _restart_ms(spark, source: str, build, checkpoint: str, arrowstate: bool) -> int:
    """The query restarted at its last version with nothing of its state held (arrowstate's
    workers stopped first; Spark's restarted query opens new stores, which load from the
    checkpoint): the wall time from its start to the end of one batch of 1,000 keys it
    already holds, the state's load included."""
    from procinfo import kill_own_state_workers
    if arrowstate:
        kill_own_state_workers()
    extra = os.path.join(source, "zz-restart.parquet")   # after every other file
    pq.write_table(pa.table({"key": pa.array(np.arange(1000, dtype=np.int64)),
                             "value": pa.array(np.ones(1000))}), extra)
    try:
        stream = (spark.readStream.schema("key long, value double")
                  .option("maxFilesPerTrigger", 1).parquet(source))
        t0 = time.perf_counter()
        q = (build(stream).writeStream.foreachBatch(lambda df, _: df.count())
             .outputMode("update")
             .trigger(availableNow=True).option("checkpointLocation", checkpoint).start())
        q.awaitTermination()
        return round((time.perf_counter() - t0) * 1000)
    finally:
        os.remove(extra)


def scaling(spark, args, case, checkpoints) -> None:
    """Per state size: the median over --runs runs of each run's median time of its last
    --batches batches, and the peak resident memory, arrowstate (under the budget) and Spark
    on RocksDB running the case (see scaling_run), the engines
    alternating run by run after --warmup rounds on a small state, their outputs compared;
    each engine's per-batch times of its last run beside them. With --arrowstate-only,
    arrowstate's runs alone (a change's effect on arrowstate, where RocksDB's share of the
    run would be most of its time)."""
    engines = (True,) if args.arrowstate_only else (True, False)
    warm_up = tempfile.mkdtemp(prefix="bench-warmup-")
    write_scaling_batches(warm_up, 30_000, 10_000)
    for i in range(max(1, args.warmup)):
        for on in (engines if i % 2 == 0 else engines[::-1]):
            scaling_run(spark, warm_up, on, case, checkpoints)
    shutil.rmtree(warm_up, ignore_errors=True)
    for state_keys in [int(k) for k in args.state_keys.split(",")]:
        source = tempfile.mkdtemp(prefix="bench-scaling-")
        batches = write_scaling_batches(source, state_keys, args.batch_rows)
        try:
            result = {"case": f"scaling_{args.scaling_case}_new_keys",
                      "state_keys": state_keys,
                      "batch_rows": args.batch_rows, "batches": batches,
                      "measured_batches": min(args.batches, batches), "runs": args.runs,
                      "checkpoint": checkpoints.kind,
                      "budget": spark.sparkContext.getConf().get(
                          "spark.executor.pyspark.memory", "none")}
            medians = {True: [], False: []}
            restarts = {True: [], False: []}
            outputs = {True: [], False: []}
            for i in range(args.runs):
                for on in (engines if i % 2 == 0 else engines[::-1]):
                    durations, answers, peak = scaling_run(spark, source, on, case,
                                                           checkpoints)
                    outputs[on].append(answers)
                    restarts[on].append(peak.pop("restart_ms"))
                    medians[on].append(statistics.median(
                        durations[-result["measured_batches"]:]))
                    name = "arrowstate" if on else "rocksdb"
                    result[f"{name}_batch_ms"] = durations   # the last run's
                    result.update({f"{name}_{k}": v for k, v in peak.items()})
            for on, name in ((True, "arrowstate"), (False, "rocksdb")):
                if on in engines:
                    result[f"{name}_batch_ms_median"] = statistics.median(medians[on])
                    result[f"{name}_restart_ms_median"] = statistics.median(restarts[on])
            answers = outputs[True] + outputs[False]
            result["same_answers"] = all(o == answers[0] for o in answers)
            if len(engines) == 2:
                result["speedup"] = round(result["rocksdb_batch_ms_median"]
                                          / result["arrowstate_batch_ms_median"], 2)
            half = result["arrowstate_batch_ms"][len(result["arrowstate_batch_ms"]) // 2:]
            written = result["arrowstate_state_bytes_written"]
            # flatness: the slowest of the last half of the batches against their
            # median, and the most bytes a batch wrote against the median batch's
            result["arrowstate_slowest_over_median"] = round(max(half)
                                                             / statistics.median(half), 2)
            result["arrowstate_most_bytes_over_median"] = round(
                max(written) / statistics.median(written), 2)
            print(json.dumps(result), flush=True)
        finally:
            shutil.rmtree(source, ignore_errors=True)


def tier_ops(args) -> None:
    """The aggregate family's cost per batch inside one worker, without Spark: batches of
    --batch-rows new keys into one partition's state, sent as Spark sends them (lookups,
    then saves, in Arrow batches of 10,000 rows), with the state in memory (today's store,
    no budget) and in the tier (runs on disk over a 64 MiB cap, as under a budget). Prints
    the median seconds of the last --batches batches of each and their ratio: the tier's
    distance to the in-memory store on the same path."""
    from arrowstate.families import Aggregate
    from arrowstate.store.versions.versioned import VersionedState
    from arrowstate.store.tier.tiered import TierPlace

    schema = pa.schema([("key", pa.int64()), ("n", pa.int64()), ("s", pa.float64())])
    operator = {"keyCount": 1, "outputMode": "update", "eventTimeIndex": -1,
                "batchSize": 10000}
    batches = max(1, int(args.state_keys.split(",")[0]) // args.batch_rows)
    result = {"case": "tier_ops_agg_update_new_keys", "batch_rows": args.batch_rows,
              "batches": batches}
    for tiered in (False, True):
        directory = tempfile.mkdtemp(prefix="bench-tier-")
        rng = np.random.default_rng(1)
        family = Aggregate(operator, schema)
        state = VersionedState(family.key_fields, family.value_fields,
                               tier=TierPlace(directory + "/t", 64 << 20) if tiered else None)
        seconds = []
        try:
            for v in range(1, batches + 1):
                keys = rng.permutation(args.batch_rows).astype(np.int64) + v * args.batch_rows
                batch = pa.RecordBatch.from_arrays(
                    [pa.array(keys), pa.array(np.ones(len(keys), np.int64)),
                     pa.array(rng.random(len(keys)))], schema=schema)
                family = Aggregate(operator, schema)
                t0 = time.perf_counter()
                for lo in range(0, len(keys), 10000):
                    family.lookup(state, batch.slice(lo, 10000).select([0]))
                for lo in range(0, len(keys), 10000):
                    family.process(state, batch.slice(lo, 10000))
                list(family.finish(state))
                state.commit_files(v, 100)
                state.mark_committed(v, 1000)
                seconds.append(time.perf_counter() - t0)
        finally:
            state.close()
            shutil.rmtree(directory, ignore_errors=True)
        result["tier_s" if tiered else "memory_s"] = round(
            statistics.median(seconds[-args.batches:]), 3)
    result["tier_over_memory"] = round(result["tier_s"] / result["memory_s"], 2)
    print(json.dumps(result), flush=True)
