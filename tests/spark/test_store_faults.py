"""Faults on the object store, as Spark's FailureInjectionFileSystem (a write that fails
mid-upload) and hadoop-aws's FailureInjectionPolicy (throttling, objects not there) inject
them, met on the wire: the checkpoint is in a bucket of the tests' SeaweedFS reached
through a proxy that resets uploads and answers 503 SlowDown when a test says so
(tests/helpers/store_faults.py); and the server itself killed and started again between
batches. Each test runs the same query on Spark's own store (arrowstate off) and on
arrowstate's, with the same faults where what Spark does is the point: same rows per batch,
same state figures, and an error at least as clear as Spark's where the fault outlasts the
retries."""
import re

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

import harness
from harness import EVENTS, assert_runs_same, ev, native_run, run_query, spark_errors
from procinfo import kill_own_state_workers
from storage import unique_name
from store_faults import FaultProxy

pytestmark = pytest.mark.slow

BUCKET = "arrowstate-faults"   # reached through the proxy; the store's own bucket is not
NODE = "ArrowStateStoreSave"
BATCHES = [[ev(f"u{(i * 7 + b) % 11}", b * 10 + i, i) for i in range(12)] for b in range(4)]
RESTART = [2]   # every run is stopped after its third batch (version 3) and started again
# what a state file's write uploads: Spark's store a temporary object that it then copies to
# the file's name (`.3.delta.<uuid>.TID7.tmp`), arrowstate the file itself in place (an
# object store's upload appears whole or not at all)
TEMPORARY = r"\.[0-9a-f-]{36}(\.TID\d+)?\.tmp$"
DELTA_UPLOAD = r"/state/0/\d+/(\.\d+\.delta" + TEMPORARY + r"|\d+\.arrowstate\.delta$)"
SNAPSHOT_UPLOAD = r"/state/0/1/\d+\.arrowstate\.snapshot$"
DELTA = r"/state/0/\d+/\d+\.(arrowstate\.)?delta$"


def counts(df):
    return df.groupBy("user").agg(F.count("*").alias("n"), F.sum("v").alias("s"))


def run(spark, tmp_path, arrowstate: bool, **callbacks):
    return run_query(spark, str(tmp_path), EVENTS, BATCHES, counts, arrowstate=arrowstate,
                     output_mode="update", restart_after=RESTART, **callbacks)


def sparks(spark, tmp_path):
    """Spark's run without faults (shared by the tests that compare with it)."""
    return native_run(spark, tmp_path, EVENTS, BATCHES, counts, output_mode="update",
                      restart_after=RESTART)


def reloaded(i, checkpoint) -> None:
    """At the restart, the workers go, so the state is loaded from the object store."""
    kill_own_state_workers()


@pytest.fixture(scope="module")
def proxy(remote_stores):
    store = remote_stores.get("s3")
    assert store.make_bucket(BUCKET)
    proxy = FaultProxy(store.port).start()
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def prefix():
    return unique_name("faults")


def _checkpoints_on(spark, settings: dict, root) -> None:
    """The harness's checkpoints on `root`, the store's settings on the session (as Hadoop
    reads them), both put back after the test (the session's by _session_settings_restored,
    the harness's by the caller)."""
    for key, value in settings.items():
        spark.conf.set(key[len("spark.hadoop."):], value)
    harness.checkpoint_root = root
    harness.checkpoint_conf = settings


@pytest.fixture
def faulty(spark, spark_conf, remote_stores, proxy, prefix):
    """This test's checkpoints in the proxy's bucket, whose requests are tried 3 times by
    the SDK and S3A's operations 3 times (up to 9 tries), 100 ms apart at first; snapshots
    every 2 deltas. Yields the proxy, its rules and counts cleared after."""
    store = remote_stores.get("s3")
    b = f"spark.hadoop.fs.s3a.bucket.{BUCKET}"
    settings = {**store.spark_settings(BUCKET, proxy.endpoint),
                f"{b}.attempts.maximum": "2", f"{b}.retry.limit": "2",
                f"{b}.retry.interval": "100ms", f"{b}.retry.throttle.limit": "2",
                f"{b}.retry.throttle.interval": "100ms"}
    before = harness.checkpoint_root, harness.checkpoint_conf
    _checkpoints_on(spark, settings, lambda name: store.uri(
        f"{prefix}/{name}/ck" if name else prefix, BUCKET))
    spark_conf(**{"spark.sql.streaming.stateStore.minDeltasForSnapshot": 2})
    proxy.clear()
    proxy.forget()
    yield proxy
    proxy.clear()
    harness.checkpoint_root, harness.checkpoint_conf = before


def await_maintenance(spark) -> None:
    spark._jvm.org.apache.spark.sql.arrowstate.store.StateMaintenance.awaitIdle()


def _on_store(spark, uri: str):
    """The Hadoop filesystem of a URI, as the session reaches it, and the URI's path."""
    path = spark._jvm.org.apache.hadoop.fs.Path(uri)
    return path.getFileSystem(spark._jsparkSession.sessionState().newHadoopConf()), path


def store_files(spark, directory: str) -> list[str]:
    fs, path = _on_store(spark, directory)
    return sorted(status.getPath().toString() for status in fs.listStatus(path))


def delete_from_store(spark, uri: str) -> None:
    fs, path = _on_store(spark, uri)
    assert fs.delete(path, False), uri


def test_faults_within_the_retries_give_sparks_answers(spark, tmp_path, faulty):
    """All along, one request in five to the bucket, of every kind (the query's logs, the
    state files' lists, heads, reads, uploads, copies, deletes), is answered 503 SlowDown;
    twice each, a delta's upload and partition 1's snapshot's are cut mid-body (connection
    reset). S3A backs off and sends them again. At the restart partition 0's newest
    snapshot is deleted from the store: its state loads from the deltas, partition 1's from
    the snapshot that was sent again. The answers are Spark's."""
    deleted = []

    def arm(i, checkpoint):
        if i == 0:
            faulty.throttle(f"/{BUCKET}/", every=5)
        if i == 1:   # version 2: its deltas, and partition 1's snapshot
            faulty.reset_uploads(DELTA_UPLOAD, times=2)
            faulty.reset_uploads(SNAPSHOT_UPLOAD, times=2)

    def restart(i, checkpoint):
        kill_own_state_workers()
        await_maintenance(spark)
        deleted.append(f"{checkpoint}/state/0/0/2.arrowstate.snapshot")
        delete_from_store(spark, deleted[-1])
        assert f"{checkpoint}/state/0/1/2.arrowstate.snapshot" in store_files(
            spark, f"{checkpoint}/state/0/1")

    native = sparks(spark, tmp_path)
    ours = run(spark, tmp_path, True, between_batches=arm, on_restart=restart)
    assert_runs_same(native, ours, NODE)
    assert faulty.injected["reset"] == 4, faulty.faults
    assert faulty.injected["throttle"] >= 20, faulty.injected
    assert len(deleted) == 1
    left = [f for p in (0, 1) for f in store_files(spark, f"{ours.checkpoint}/state/0/{p}")]
    assert not [f for f in left if f.endswith(".tmp")], left   # no partial upload stays


def test_faults_outlasting_the_retries_fail_clearly_and_lose_nothing(spark, tmp_path,
                                                                     faulty):
    """Faults that last fail the batch in Spark's run and in arrowstate's: first every
    upload of the third batch's deltas is reset; then, after the restart, every read of a
    delta is throttled. arrowstate's errors name the file and the settings to change (Spark's
    name neither). Each fault cleared and the query restarted, the answers are Spark's:
    nothing committed was lost."""
    seen = []

    def arm(i, checkpoint):
        if i == 2:
            faulty.reset_uploads(DELTA_UPLOAD, times=None)

    def restart(i, checkpoint):
        kill_own_state_workers()
        # Spark's own store keeps the versions it loaded in the executor until its
        # maintenance unloads a stopped query's providers, whenever that runs: unloaded here,
        # its restart reads its deltas, as arrowstate's does with its workers gone
        spark._jvm.org.apache.spark.sql.execution.streaming.state.StateStore.stop()
        faulty.throttle(DELTA, methods=("GET",))

    def recover(failure):
        seen.append(spark_errors(failure))
        faulty.clear()

    native = run(spark, tmp_path, False, between_batches=arm, on_restart=restart,
                 recover=recover)
    ours = run(spark, tmp_path, True, between_batches=arm, on_restart=restart,
               recover=recover)
    assert_runs_same(native, ours, NODE)
    assert_runs_same(sparks(spark, tmp_path), ours, NODE)   # as if nothing had happened
    assert len(seen) == 4, seen
    (sparks_write, sparks_read), (write, read) = seen[:2], seen[2:]
    print(f"Spark's store: on the write {sorted(sparks_write)}; on the read "
          f"{sorted(sparks_read)}")
    commit = "CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT"
    assert commit in sparks_write and commit in write, (sparks_write, write)
    assert_names_file_and_settings(write[commit], ours.checkpoint, "3",
                                   ["retry.limit", "attempts.maximum"])
    unreadable = "CANNOT_LOAD_STATE_STORE.CANNOT_READ_STATE_FILE"
    assert unreadable in read, read
    assert_names_file_and_settings(read[unreadable], ours.checkpoint, "[123]",
                                   ["retry.throttle.limit"])


def assert_names_file_and_settings(error: dict, checkpoint: str, version: str,
                                   settings: list[str]) -> None:
    params = error["parameters"]
    assert error["sqlState"] == "58030", error
    assert re.fullmatch(re.escape(checkpoint) + rf"/state/0/[01]/{version}"
                        r"\.arrowstate\.delta", params["path"]), params
    for setting in settings:   # for all buckets, and for this one
        assert f"spark.hadoop.fs.s3a.{setting}" in params["setting"], params
        assert f"spark.hadoop.fs.s3a.bucket.{BUCKET}.{setting}" in params["setting"], params


def test_a_delta_missing_at_load(spark, tmp_path, faulty):
    """Between the runs, the newest delta of partition 0 (version 3) is deleted from the
    store, and version 3's snapshot with it where Spark's maintenance happened to write one
    while the query ran (Spark's store snapshots the newest version it holds when more than
    `minDeltasForSnapshot` deltas follow the last snapshot; arrowstate's snapshots versions
    2, 4, ...): Spark's store and arrowstate's both fail to load it, naming the file;
    arrowstate names the operator, partition and version too."""
    deleted = []

    def delete(i, checkpoint):
        kill_own_state_workers()
        await_maintenance(spark)
        suffix = ".arrowstate" if "-on/" in checkpoint else ""
        partition = f"{checkpoint}/state/0/0"
        deleted.append(f"{partition}/3{suffix}.delta")
        delete_from_store(spark, deleted[-1])
        snapshot = f"{partition}/3{suffix}.snapshot"
        if snapshot in store_files(spark, partition):
            delete_from_store(spark, snapshot)

    failures = []
    for arrowstate in (False, True):
        with pytest.raises(StreamingQueryException) as failure:
            run(spark, tmp_path, arrowstate, on_restart=delete)
        failures.append(failure.value)
    missing = "CANNOT_LOAD_STATE_STORE.CANNOT_READ_DELTA_FILE_NOT_EXISTS"
    sparks_error, ours = (spark_errors(f)[missing] for f in failures)
    assert sparks_error["parameters"]["fileToRead"] == deleted[0], sparks_error
    assert ours["sqlState"] == sparks_error["sqlState"] == "58030"
    assert ours["parameters"]["path"] == deleted[1].rsplit("/", 1)[0], ours
    assert deleted[1] in str(failures[1]), str(failures[1])
    assert "operator 0, partition 0, version 3" in str(failures[1]), str(failures[1])


def test_the_store_restarted_between_batches(spark, tmp_path, remote_stores):
    """The object store's server is killed and started again on the same data between two
    batches of a running query (its clients' connections all dropped): the next batch runs
    on, in Spark's run and in arrowstate's, with Spark's answers; the restarted query too."""
    store = remote_stores.get("s3")
    before = harness.checkpoint_root, harness.checkpoint_conf
    _checkpoints_on(spark, store.spark_settings(), remote_stores.root("s3"))
    restarts = []

    def restart_store(i, checkpoint):
        if i == 1:
            store.restart()
            restarts.append(checkpoint)

    try:
        native, ours = (run(spark, tmp_path, arrowstate, between_batches=restart_store,
                            on_restart=reloaded) for arrowstate in (False, True))
    finally:
        harness.checkpoint_root, harness.checkpoint_conf = before
    assert_runs_same(native, ours, NODE)
    assert len(restarts) == 2


# snapshots interrupted again and again on the object store (as test_checkpoint_retention.py
# on the local disk): each manifest's upload cut until the retries are spent, after its run
# files went up, then the workers lost
RETENTION_BATCHES = [[ev(f"u{(i * 7 + b) % 11}", b * 10 + i, i) for i in range(12)]
                     for b in range(18)]
MANIFEST_UPLOAD = r"/state/0/\d+/\d+(_[0-9a-f-]+)?\.arrowstate\.snapshot$"


def _unnamed_run_files(spark, checkpoint: str) -> list[str]:
    """The run files of the operator's partitions that no snapshot file there names."""
    from arrowstate.store.formats import manifest
    jvm = spark._jvm
    fs, _ = _on_store(spark, checkpoint)
    found = fs.globStatus(jvm.org.apache.hadoop.fs.Path(f"{checkpoint}/state/0/*/*")) or []
    paths = [s.getPath() for s in found]
    runs = {p.toString() for p in paths if p.getName().endswith(".arrowstate.run")}
    named = set()
    for p in paths:
        if p.getName().endswith(".arrowstate.snapshot"):
            stream = fs.open(p)
            try:
                data = bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
            finally:
                stream.close()
            made = manifest.read(p.toString(), "", data)
            if made is not None:
                named |= {f"{p.getParent().toString()}/{n}" for n in made.names()}
    return sorted(runs - named)


def test_interrupted_snapshots_leave_no_files_behind_on_the_store(spark, spark_conf, tmp_path,
                                                                   faulty):
    spark_conf(**{"spark.sql.streaming.stateStore.minDeltasForSnapshot": 1,
                  "spark.sql.streaming.minBatchesToRetain": 2,
                  "spark.arrowstate.worker.memory": "8g",
                  "spark.arrowstate.worker.stateMemoryPercent": "0"})
    unnamed = []

    def interrupt(i, checkpoint):
        await_maintenance(spark)
        unnamed.append(len(_unnamed_run_files(spark, checkpoint)))
        faulty.clear()
        # a snapshot ships in the commit after its own: the next batch's manifest upload
        # fails, then the worker is lost (its state reloads from the last good snapshot)
        if i < len(RETENTION_BATCHES) - 4 and i % 2 == 0:
            faulty.reset_uploads(MANIFEST_UPLOAD, times=50)
        elif i < len(RETENTION_BATCHES) - 4:
            kill_own_state_workers()

    native = native_run(spark, tmp_path, EVENTS, RETENTION_BATCHES, counts,
                        output_mode="update")
    ours = run_query(spark, str(tmp_path), EVENTS, RETENTION_BATCHES, counts,
                     arrowstate=True, output_mode="update", between_batches=interrupt)
    assert_runs_same(native, ours, NODE)
    assert faulty.injected["reset"] > 0
    await_maintenance(spark)
    left = _unnamed_run_files(spark, ours.checkpoint)
    assert max(unnamed) >= 4, unnamed   # interrupted snapshots left run files unnamed...
    assert len(left) <= 4, (left, unnamed)   # ...and retention deleted them
