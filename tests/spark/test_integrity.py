"""State you can trust, tested as Spark tests its stores: failures injected into the
checkpoint filesystem at each step of a commit and of a snapshot write, workers killed
mid-batch, damaged files, and checkpoints reused, restored from copies or rewound. Each run
is compared with native Spark doing the same."""
import datetime as dt
import glob
import os
import shutil

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming.state import GroupStateTimeout

from arrowstate.store.formats import container, manifest
from harness import assert_runs_same, assert_same, native_run, run_query, spark_errors
from procinfo import kill_own_state_workers

NODE = "ArrowStreamingDeduplicate"
EVENTS = pa.schema([("user", pa.string()), ("ts", pa.timestamp("us", tz="UTC")),
                    ("v", pa.int64())])
INJECTING = "org.apache.spark.sql.arrowstate.testing.FailureInjectionFileManager"


def ev(user, second, v=0):
    return {"user": user, "ts": dt.datetime.fromtimestamp(second, dt.timezone.utc), "v": v}


BATCHES = [[ev(f"u{(i * 7 + j) % 13}", i * 10 + j) for j in range(6)] for i in range(6)]


def dedup(df):
    return df.withWatermark("ts", "25 seconds").dropDuplicates(["user", "ts"])


def await_maintenance(spark):
    spark._jvm.org.apache.spark.sql.arrowstate.store.StateMaintenance.awaitIdle()


def state_files(checkpoint):
    return sorted(glob.glob(os.path.join(checkpoint, "state", "*", "*", "*.arrowstate.*")))


def assert_every_file_verifies(run_dir_glob):
    """No file left behind that a later load would trust wrongly: all verify whole."""
    paths = [p for d in glob.glob(run_dir_glob) for p in state_files(d)]
    assert paths
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        assert container.unique_id(data) is not None, path   # a complete format-2 file
        assert not os.path.basename(path).startswith("."), path


@pytest.fixture
def injection(spark):
    jvm_injection = spark._jvm.org.apache.spark.sql.arrowstate.testing.FailureInjection
    jvm_injection.reset()
    yield jvm_injection
    jvm_injection.reset()


# (what fails, which file, how often): once is retried as a task; five times fail the
# query, which is then restarted from its checkpoint
COMMIT_FAILURES = [
    ("createAtomic", "delta", 1), ("write", "delta", 1), ("close", "delta", 1),
    ("afterClose", "delta", 1), ("afterClose", "delta", 5), ("close", "delta", 5),
    ("createAtomic", "snapshot", 5), ("close", "snapshot", 5), ("afterClose", "snapshot", 5),
    ("delete", "", 50),
]


@pytest.mark.local_checkpoints
@pytest.mark.parametrize("op,kind,times", COMMIT_FAILURES,
                         ids=[f"{op}-{kind or 'prune'}-x{n}" for op, kind, n in COMMIT_FAILURES])
def test_failure_at_each_point_of_a_commit_or_snapshot(spark, spark_conf, injection, tmp_path,
                                                       op, kind, times):
    spark_conf(**{"spark.sql.streaming.stateStore.minDeltasForSnapshot": 1,
                  "spark.sql.streaming.minBatchesToRetain": 2,
                  "spark.sql.streaming.checkpointFileManagerClass": INJECTING})
    pattern = f".*/state/0/1/3\\.arrowstate\\.{kind}" if kind else ".*\\.arrowstate\\..*"
    _assert_same_with_failures(spark, injection, tmp_path, op, pattern, times)


def _assert_same_with_failures(spark, injection, tmp_path, op, pattern, times):
    """Spark's answers with failures of `op` on files matching `pattern` armed before the
    third batch (`times` of them) and the workers killed after the fifth, so that the files
    the failures touched are loaded again; every file left verifies."""
    def arm_before_third(i, _checkpoint):
        if i == 2:
            injection.arm(op, pattern, times)
        if i == 4:
            await_maintenance(spark)
            kill_own_state_workers()

    # failures are injected into arrowstate's run only: Spark's, the same for each case,
    # runs once
    native = native_run(spark, tmp_path, EVENTS, BATCHES, dedup)
    ours = run_query(spark, str(tmp_path), EVENTS, BATCHES, dedup, arrowstate=True,
                     between_batches=arm_before_third,
                     recover=lambda failure: injection.disarm())
    assert_runs_same(native, ours, NODE)
    assert injection.failures(op) > 0, "the failure was never injected"
    await_maintenance(spark)
    assert_every_file_verifies(str(tmp_path / "run*-on" / "ck"))


@pytest.mark.local_checkpoints
def test_the_worker_goes_back_before_the_delta_is_written(spark, spark_conf, injection,
                                                          tmp_path):
    """A small delta is read whole into the JVM, and its worker goes back to the pool before
    the checkpoint's filesystem writes it: the next task of any partition that worker holds
    does not wait for the write (on HDFS most of a task). One partition, so one task at a
    time: no worker is lent as each delta is published. The answers are Spark's."""
    spark_conf(**{"spark.sql.shuffle.partitions": 1,
                  "spark.sql.streaming.checkpointFileManagerClass": INJECTING})
    injection.arm("lentAtClose", r".*/state/0/0/\d+\.arrowstate\.delta", 100)
    native = native_run(spark, tmp_path, EVENTS, BATCHES, dedup)
    ours = run_query(spark, str(tmp_path), EVENTS, BATCHES, dedup, arrowstate=True)
    assert_runs_same(native, ours, NODE)
    lent = list(injection.lentAtCloses())
    assert len(lent) >= len(BATCHES) and set(lent) == {0}, lent


# run files of snapshots that name runs (state on the tier): written by the maintenance
# thread, so a failure loses a snapshot, never a commit
RUN_FILE_FAILURES = [("createAtomic", 3), ("afterClose", 3), ("delete", 50)]


@pytest.mark.local_checkpoints
@pytest.mark.parametrize("op,times", RUN_FILE_FAILURES,
                         ids=[f"{op}-x{n}" for op, n in RUN_FILE_FAILURES])
def test_failure_writing_or_deleting_run_files(spark, spark_conf, injection, tmp_path, op,
                                               times):
    """State on the tier snapshots every version as a manifest naming run files: the
    filesystem fails their writes (a manifest then is not written, and a later one that
    would name the missing files is not either) or their deletion by retention; after the
    workers are killed every load repairs around what is missing, with Spark's answers."""
    spark_conf(**{"spark.sql.streaming.stateStore.minDeltasForSnapshot": 1,
                  "spark.sql.streaming.minBatchesToRetain": 2,
                  "spark.sql.streaming.checkpointFileManagerClass": INJECTING,
                  "spark.arrowstate.worker.memory": "8g",
                  "spark.arrowstate.worker.stateMemoryPercent": "0"})
    _assert_same_with_failures(spark, injection, tmp_path, op,
                               ".*/state/0/1/[0-9a-f]{32}\\.arrowstate\\.run", times)
    assert glob.glob(str(tmp_path / "run*-on" / "ck" / "state" / "0" / "*" / "*.arrowstate.run"))


def exits_once(marker):
    """A state function whose worker process dies on its first call for user u3."""
    def count(key, pdfs, state):
        if key[0] == "u3" and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)
        n = (state.get[0] if state.exists else 0) + sum(len(p) for p in pdfs)
        state.update((n,))
        yield pd.DataFrame({"user": [key[0]], "n": [n]})
    return count


def test_worker_killed_before_the_input_ends(spark, tmp_path):
    """The process running the task dies mid-input, natively and in arrowstate alike; the
    retried task reloads and the answers are Spark's."""
    markers = iter(str(tmp_path / f"died-{i}") for i in range(2))

    def build(df):
        return df.groupBy("user").applyInPandasWithState(
            exits_once(next(markers)), "user string, n long", "n long", "Update",
            GroupStateTimeout.NoTimeout)

    assert_same(spark, tmp_path, EVENTS, BATCHES, build,
                expect_node="ArrowFlatMapGroupsWithState", output_mode="update",
                custom_metrics=["stateCacheMisses"])
    assert all(os.path.exists(tmp_path / f"died-{i}") for i in range(2))


@pytest.mark.local_checkpoints
def test_damaged_newest_snapshot_is_repaired_around(spark, spark_conf, tmp_path):
    spark_conf(**{"spark.sql.streaming.stateStore.minDeltasForSnapshot": 2})
    damaged = []

    def damage_before_fifth(i, checkpoint):
        if i == 4 and "-on" in checkpoint:
            await_maintenance(spark)
            kill_own_state_workers()
            for d in glob.glob(os.path.join(checkpoint, "state", "0", "*")):
                snaps = sorted(glob.glob(os.path.join(d, "*.arrowstate.snapshot")),
                               key=lambda p: int(os.path.basename(p).split(".")[0]))
                if len(snaps) >= 2:
                    with open(snaps[-1], "r+b") as f:
                        f.seek(10)
                        f.write(b"\xff")
                    damaged.append(snaps[-1])

    _, ours = assert_same(spark, tmp_path, EVENTS, BATCHES, dedup, expect_node=NODE,
                          between_batches=damage_before_fifth,
                          custom_metrics=["stateSnapshotsSkipped"])
    assert damaged
    assert sum(c[0]["stateSnapshotsSkipped"] for c in ours.custom.values()) == len(damaged)


@pytest.mark.local_checkpoints
@pytest.mark.parametrize("how", ["damaged", "missing"])
def test_a_run_file_damaged_or_missing_is_repaired_around(spark, spark_conf, tmp_path, how):
    """State on the tier snapshots as manifests naming run files: a run file that only the
    newest snapshot names is damaged or gone when the workers are lost; the tasks load the
    snapshot before it and the deltas after, with Spark's answers, and count the skip."""
    spark_conf(**{"spark.sql.streaming.stateStore.minDeltasForSnapshot": 2,
                  "spark.arrowstate.worker.memory": "8g",
                  "spark.arrowstate.worker.stateMemoryPercent": "0"})
    harmed = []

    def harm_before_fifth(i, checkpoint):
        if i != 4 or "-on" not in checkpoint:
            return
        await_maintenance(spark)
        kill_own_state_workers()
        for d in glob.glob(os.path.join(checkpoint, "state", "0", "*")):
            named = {}
            for path in glob.glob(os.path.join(d, "*.arrowstate.snapshot")):
                with open(path, "rb") as f:
                    named[int(os.path.basename(path).split(".")[0])] = manifest.read(
                        path, "", f.read()).names()
            if len(named) < 2:
                continue
            newest = max(named)
            only = sorted(named[newest] - set().union(*(n for v, n in named.items()
                                                        if v != newest)))
            if only:
                victim = os.path.join(d, only[0])
                if how == "missing":
                    os.remove(victim)
                else:
                    with open(victim, "r+b") as f:
                        f.seek(10)
                        f.write(b"\xff")
                harmed.append(victim)

    _, ours = assert_same(spark, tmp_path, EVENTS, BATCHES, dedup, expect_node=NODE,
                          between_batches=harm_before_fifth,
                          custom_metrics=["stateSnapshotsSkipped"])
    assert harmed
    assert sum(c[0]["stateSnapshotsSkipped"] for c in ours.custom.values()) == len(harmed)


@pytest.mark.local_checkpoints
def test_damaged_delta_fails_naming_file_operator_partition_and_version(spark, tmp_path):
    batches = [[ev("a", 1)], [ev("b", 2)], [ev("c", 3)]]
    damaged = []

    def damage_before_third(i, checkpoint):
        if i == 2:
            kill_own_state_workers()
            path = glob.glob(os.path.join(checkpoint, "state", "0", "*", "2.arrowstate.delta"))[0]
            with open(path, "r+b") as f:
                f.seek(20)
                f.write(b"\x00\x01")
            damaged.append(path)

    with pytest.raises(StreamingQueryException) as failure:
        run_query(spark, str(tmp_path), EVENTS, batches, lambda df: df.dropDuplicates(["user"]),
                  arrowstate=True, between_batches=damage_before_third)
    partition = os.path.basename(os.path.dirname(damaged[0]))
    error = spark_errors(failure.value)["CANNOT_LOAD_STATE_STORE.CORRUPT_STATE_FILE"]
    assert error["sqlState"] == "58030"
    params = error["parameters"]
    assert params["path"].endswith(f"/state/0/{partition}/2.arrowstate.delta"), params
    assert params["context"] == f"operator 0, partition {partition}, version 2", params
    assert "checksum mismatch" in params["reason"], params


@pytest.mark.local_checkpoints
def test_checkpoint_deleted_and_reused_at_the_same_path(spark, tmp_path):
    assert_same(spark, tmp_path, EVENTS, BATCHES, dedup, expect_node=NODE,
                restart_after=[2], on_restart=lambda i, ck: shutil.rmtree(ck))


@pytest.mark.local_checkpoints
def test_checkpoint_restored_from_a_copy_at_the_same_path(spark, tmp_path):
    """Two lineages reach the same version: the worker holds lineage B's, the checkpoint
    is restored to lineage A's copy. The state in memory must not be taken for the copy's."""
    batches = [[ev("a", 1)], [ev("b", 2)], [ev("c", 3), ev("d", 4)],
               [ev("c", 3), ev("d", 4), ev("zz", 9), ev("e", 5)]]
    steps = {}

    def lineages(i, checkpoint):
        copies = checkpoint + "-copies"
        source = os.path.join(os.path.dirname(checkpoint), "in")
        step = steps[checkpoint, i] = steps.get((checkpoint, i), 0) + 1
        if i == 1:      # after batches 0, 1 (version 2): keep a copy
            shutil.copytree(checkpoint, os.path.join(copies, "at-1"))
        elif i == 2 and step == 1:   # batch 2 made lineage A's version 3; run B's instead
            shutil.copytree(checkpoint, os.path.join(copies, "lineage-a"))
            shutil.rmtree(checkpoint)
            shutil.copytree(os.path.join(copies, "at-1"), checkpoint)
            os.rename(os.path.join(source, "00002.parquet"), os.path.join(copies, "a.parquet"))
            pq.write_table(pa.Table.from_pylist([ev("zz", 9)], schema=EVENTS),
                           os.path.join(source, "00002b.parquet"))
            return True
        elif i == 2:    # back to lineage A's version 3, while the worker holds B's
            shutil.rmtree(checkpoint)
            shutil.copytree(os.path.join(copies, "lineage-a"), checkpoint)
            os.remove(os.path.join(source, "00002b.parquet"))
            os.rename(os.path.join(copies, "a.parquet"), os.path.join(source, "00002.parquet"))
        return False

    assert_same(spark, tmp_path, EVENTS, batches, lambda df: df.dropDuplicates(["user", "ts"]),
                expect_node=NODE, restart_after=[1, 2], on_restart=lineages,
                custom_metrics=["stateCacheHits"])


@pytest.mark.local_checkpoints
def test_newest_offsets_and_commits_deleted_and_the_batch_run_again(spark, tmp_path):
    def rewind(i, checkpoint):
        newest = max(int(n) for n in os.listdir(os.path.join(checkpoint, "commits"))
                     if n.isdigit())
        for sub in ("offsets", "commits"):
            for name in (str(newest), f".{newest}.crc"):   # the file and Hadoop's checksum
                if os.path.exists(os.path.join(checkpoint, sub, name)):
                    os.remove(os.path.join(checkpoint, sub, name))

    assert_same(spark, tmp_path, EVENTS, BATCHES, dedup, expect_node=NODE,
                restart_after=[2, 4], on_restart=rewind)


@pytest.mark.local_checkpoints
def test_state_files_written_whole_without_checksum_files(spark, tmp_path):
    """On the local filesystem the JVM writes state files itself (no child process per
    file): each renamed into place whole, no temporary file and no Hadoop checksum file left
    beside them. A checksum Hadoop wrote for an earlier file of the same name (here, before
    a batch runs again) goes when the file is rewritten: the next query run loads every
    delta through Hadoop's checksummed filesystem, which would otherwise fail on it."""
    def rewind_with_stale_checksums(i, checkpoint):
        newest = max(int(n) for n in os.listdir(os.path.join(checkpoint, "commits"))
                     if n.isdigit())
        for sub in ("offsets", "commits"):
            for name in (str(newest), f".{newest}.crc"):
                if os.path.exists(os.path.join(checkpoint, sub, name)):
                    os.remove(os.path.join(checkpoint, sub, name))
        if i == 2:   # the batch run again rewrites this delta in each partition
            for part in glob.glob(os.path.join(checkpoint, "state", "0", "[0-9]*")):
                with open(os.path.join(part, f".{newest + 1}.arrowstate.delta.crc"), "wb") as f:
                    f.write(b"crc\x00\x00\x02\x00\x00\x00\x00")   # a checksum of other bytes

    assert_same(spark, tmp_path, EVENTS, BATCHES, dedup, expect_node=NODE,
                restart_after=[2, 4], on_restart=rewind_with_stale_checksums)
    [ours] = glob.glob(str(tmp_path / "run*-on" / "ck"))
    parts = glob.glob(os.path.join(ours, "state", "0", "[0-9]*"))   # not Spark's _metadata
    assert parts and all(not name.startswith(".") for part in parts
                         for name in os.listdir(part))
    assert_every_file_verifies(ours)
