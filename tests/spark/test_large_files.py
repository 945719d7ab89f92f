"""State files of any size: a file crosses between the JVM and the worker as bounded chunks
(contract.json's `chunks`), streamed from and into the checkpoint by the JVM, and the worker
receives one over spark.arrowstate.worker.fileMemoryBytes into a memory-mapped local file.
The limits are lowered here so that files of a few MB take every path a file over 2 GiB
takes: many chunks each way, and the temporary file; Spark's own run is the oracle."""
import os
import random
import string

import pyarrow as pa
from pyspark.sql import functions as F

from arrowstate.spark_state.filesystems import files_for

from harness import assert_runs_same, native_run, read_state, run_query

SAVE = "ArrowStateStoreSave"
SCHEMA = pa.schema([("k", pa.int64()), ("s", pa.string())])
CHUNK, IN_MEMORY = 64 << 10, 1 << 20


def _batches(count=5, new_keys=30000, seed=7):
    """Each batch brings new keys with 60-character values and updates some older ones:
    deltas of a few MB, and snapshots growing with the state."""
    rng = random.Random(seed)
    letters = string.ascii_letters

    def value():
        return "".join(rng.choices(letters, k=60))

    out = []
    for b in range(count):
        rows = [{"k": b * new_keys + i, "s": value()} for i in range(new_keys)]
        rows += [{"k": rng.randrange(max(1, b * new_keys)), "s": value()} for _ in range(2000)]
        out.append(rows)
    return out


def _aggregate(df):
    return df.groupBy("k").agg(F.count("*").alias("n"), F.max("s").alias("s"))


def _file_sizes(checkpoint):
    """Every arrowstate state file under the checkpoint's operator 0: name -> bytes."""
    files = files_for(checkpoint)
    root = os.path.join(checkpoint, "state", "0")
    sizes = {}
    for partition in files.listdir(root):
        if partition.isdigit():
            sizes.update({f"{partition}/{n}": b
                          for n, b in files.file_sizes(os.path.join(root, partition)).items()
                          if ".arrowstate." in n})
    return sizes


def test_files_of_many_chunks_through_the_temporary_file(spark, spark_conf, tmp_path):
    local = tmp_path / "local"
    spark_conf(**{"spark.sql.streaming.stateStore.minDeltasForSnapshot": 2,
                  "spark.arrowstate.worker.fileChunkBytes": CHUNK,
                  "spark.arrowstate.worker.fileMemoryBytes": IN_MEMORY,
                  "spark.arrowstate.worker.localDir": str(local)})
    batches = _batches()
    restarted_from = {}

    def check_files(i, checkpoint):
        if "-on" not in checkpoint:
            return
        spark._jvm.org.apache.spark.sql.arrowstate.store.StateMaintenance.awaitIdle()
        restarted_from.update(_file_sizes(checkpoint))

    native = native_run(spark, tmp_path, SCHEMA, batches, _aggregate, output_mode="update")
    ours = run_query(spark, str(tmp_path), SCHEMA, batches, _aggregate, arrowstate=True,
                     output_mode="update", restart_after=[2], on_restart=check_files,
                     custom_metrics=["stateCacheMisses"])
    assert_runs_same(native, ours, SAVE)

    # the restart loaded the state from files over the in-memory limit, a snapshot among
    # them, each of many chunks
    snapshots = {n: b for n, b in restarted_from.items() if n.endswith(".snapshot")}
    deltas = {n: b for n, b in restarted_from.items() if n.endswith(".delta")}
    assert snapshots and all(b > IN_MEMORY for b in snapshots.values()), restarted_from
    assert all(b > 10 * CHUNK for b in deltas.values()), restarted_from
    assert ours.custom[3][0]["stateCacheMisses"] == 2, ours.custom   # both partitions
    # the files went through temporary files in the workers' local directory (made on the
    # first one), which left nothing behind
    assert os.listdir(local / "received") == []

    # Spark's statestore reader reads the same state, through the same files
    for batch in (2, 4):
        assert (read_state(spark, ours.checkpoint, batch, {})
                == read_state(spark, native.checkpoint, batch, {})), batch
