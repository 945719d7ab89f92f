"""Every file of a checkpoint accounted for: snapshots interrupted again and again (their
run files written, their manifest never, the worker lost each time) leave run files that
retention deletes once the snapshot it prunes to is newer than them (the rule of Spark's
RocksDB file manager for its orphan files), so the checkpoint stays bounded in files and
bytes, with Spark's answers."""
import glob
import os

import pytest

from arrowstate.store.formats import manifest
from harness import assert_runs_same, native_run, run_query
from procinfo import kill_own_state_workers
from test_integrity import (BATCHES, EVENTS, INJECTING, NODE, await_maintenance, dedup, ev,
                            injection)  # noqa: F401 (a fixture)

V2 = {"spark.sql.streaming.stateStore.checkpointFormatVersion": "2",
      "spark.sql.streaming.stateStore.providerClass":
          "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"}
# more batches than test_integrity's: retention must pass the interrupted snapshots
LONG = BATCHES + [[ev(f"u{(i * 5 + j) % 13}", i * 10 + j) for j in range(6)]
                  for i in range(6, 16)]


def _run_files(checkpoint):
    return glob.glob(os.path.join(checkpoint, "state", "0", "*", "*.arrowstate.run"))


def _named(checkpoint):
    """The run files some manifest of the checkpoint names."""
    named = set()
    for path in glob.glob(os.path.join(checkpoint, "state", "0", "*", "*.arrowstate.snapshot")):
        with open(path, "rb") as f:
            made = manifest.read(path, "", f.read())
        if made is not None:
            named |= {os.path.join(os.path.dirname(path), n) for n in made.names()}
    return named


@pytest.mark.local_checkpoints
@pytest.mark.parametrize("format_version", ["1", "2"])
def test_interrupted_snapshots_leave_no_files_behind(spark, spark_conf, injection, tmp_path,
                                                     format_version):
    spark_conf(**(V2 if format_version == "2" else {}),
               **{"spark.sql.streaming.stateStore.minDeltasForSnapshot": 1,
                  "spark.sql.streaming.minBatchesToRetain": 2,
                  "spark.sql.streaming.checkpointFileManagerClass": INJECTING,
                  "spark.arrowstate.worker.memory": "8g",
                  "spark.arrowstate.worker.stateMemoryPercent": "0"})
    unnamed_seen = []

    def interrupt_each_snapshot(i, checkpoint):
        await_maintenance(spark)
        unnamed_seen.append(len(set(_run_files(checkpoint)) - _named(checkpoint)))
        if i < len(LONG) - 4:
            # the next manifest is not written (its run files are): then the worker is lost
            injection.arm("createAtomic", ".*/state/0/.*\\.arrowstate\\.snapshot", 2)
            kill_own_state_workers()
        else:
            injection.disarm()

    native = native_run(spark, tmp_path, EVENTS, LONG, dedup)
    ours = run_query(spark, str(tmp_path), EVENTS, LONG, dedup, arrowstate=True,
                     between_batches=interrupt_each_snapshot,
                     recover=lambda failure: injection.disarm())
    assert_runs_same(native, ours, NODE)
    assert injection.failures("createAtomic") > 0
    await_maintenance(spark)
    left = set(_run_files(ours.checkpoint)) - _named(ours.checkpoint)
    # interrupted snapshots left run files no manifest names, more each time...
    assert max(unnamed_seen) >= 4, unnamed_seen
    # ...and retention deleted them: what is left is bounded by what the last few
    # versions wrote, not by how often the snapshots were interrupted
    assert len(left) <= 2 * 2, (sorted(left), unnamed_seen)
    files = glob.glob(os.path.join(ours.checkpoint, "state", "0", "*", "*"))
    assert len(files) <= 40, sorted(files)
