"""The state tools and leaving arrowstate with the checkpoint on HDFS (Hadoop's
MiniDFSCluster) and on an S3-compatible object store through `s3a://`
(tests/helpers/storage.py): `state describe` and `history` say what they say of the same
query's checkpoint on the local disk; `export`, `import` and `repartition` convert the state
there, and the query continues with Spark's answers; a query restarted with arrowstate off
converts its state at planning and continues on Spark's operators."""
import os

import pytest

import harness
import storage
from arrowstate.spark_state import describe, history
from arrowstate.spark_state.filesystems import files_for
from harness import EVENTS, ev, native_run, read_state, run_query, state_command

pytestmark = [pytest.mark.slow,
              pytest.mark.parametrize("remote_checkpoints", storage.stores_of_costly_tests(),
                                      indirect=True)]

BATCHES = [[ev("a", 10, 1), ev("b", 12, 2), ev("a", 13, 1)], [ev("a", 20, 3), ev("c", 30)],
           [ev("b", 40, 2), ev("a", 41)], [ev("a", 42), ev("b", 43), ev("d", 44, 2)],
           [ev("b", 60, 2), ev("c", 61, 2), ev("e", 62)]]
RESTART = 2   # after batch 2: the tools run on the stopped query's state of version 3


def query(df):   # two operators, the second's rows depend on the first's
    return df.dropDuplicates(["user", "v"]).groupBy("user").count()


def _native(spark, tmp_path):
    """Spark's own run, with its checkpoint on the store (shared by this file's tests)."""
    return native_run(spark, tmp_path, EVENTS, BATCHES, query, output_mode="update",
                      restart_after=[RESTART])


def _ours(spark, tmp_path, arrowstate: bool, between):
    """The query run by arrowstate (or Spark), stopped after batch RESTART; `between(ck)`
    runs then (the query stays stopped), and the query continues from its checkpoint."""
    def on_restart(i, checkpoint):
        between(checkpoint)
        return False

    return run_query(spark, str(tmp_path), EVENTS, BATCHES, query, arrowstate=arrowstate,
                     output_mode="update", restart_after=[RESTART], on_restart=on_restart)


def _on(store, checkpoint: str) -> None:
    assert checkpoint.startswith(store.uri("")), checkpoint


def _without(d: dict, *keys) -> dict:
    return {k: v for k, v in d.items() if k not in keys}


def _local_state_bytes(checkpoint: str, op: int) -> int:
    """What the operator's files hold on the local disk, Hadoop's checksum files aside
    (HDFS and object stores keep none)."""
    return sum(os.path.getsize(os.path.join(root, n))
               for root, _, names in os.walk(os.path.join(checkpoint, "state", str(op)))
               for n in names if not n.endswith(".crc"))


def _rows(spark, checkpoint: str) -> list[str]:
    """The newest state of operator 0 (the aggregation), by Spark's reader, wherever its
    partitioning puts each row."""
    return read_state(spark, checkpoint, None, {},
                      lambda row: {k: v for k, v in row.items() if k != "partition_id"})


def test_describe_and_history_as_on_the_local_disk(spark, tmp_path, remote_checkpoints):
    """The same query's checkpoint on the store and on the local disk: `describe` (as users
    run it, a process with the store's settings as --conf, and in this process) and
    `history` give the same operators, rows, versions, schemas and figures."""
    remote = run_query(spark, str(tmp_path), EVENTS, BATCHES, query, arrowstate=True,
                       output_mode="update", restart_after=[RESTART])
    _on(remote_checkpoints, remote.checkpoint)
    root, harness.checkpoint_root = harness.checkpoint_root, None
    try:
        local = run_query(spark, str(tmp_path), EVENTS, BATCHES, query, arrowstate=True,
                          output_mode="update", restart_after=[RESTART])
    finally:
        harness.checkpoint_root = root
    assert remote.outputs == local.outputs

    described = describe(remote.checkpoint)
    assert state_command("describe", remote.checkpoint, "--json", cli=True) == described
    assert described["checkpoint"] == remote.checkpoint
    on_disk = describe(local.checkpoint)
    assert described["lastCommittedBatch"] == on_disk["lastCommittedBatch"] == len(BATCHES) - 1
    assert [o["engine"] for o in described["operators"]] == ["arrowstate"] * 2
    assert ([_without(o, "bytes_on_disk") for o in described["operators"]]
            == [_without(o, "bytes_on_disk") for o in on_disk["operators"]])
    for o in described["operators"]:
        assert o["rows"] > 0
        assert o["bytes_on_disk"] == _local_state_bytes(local.checkpoint, o["operator_id"])

    h, local_h = history(remote.checkpoint), history(local.checkpoint)
    assert h["operators"] == local_h["operators"]
    assert h["uncommittedBatches"] == local_h["uncommittedBatches"] == []
    times = ("batchTimestampMs", "committedAtMs", "durationMs")
    assert [_without(b, *times) for b in h["batches"]] == \
        [_without(b, *times) for b in local_h["batches"]]
    # an object's time on S3 is to the second: the history says so, and a batch that
    # ended within the second it started in may have no duration
    assert h["timeResolutionMs"] == (1000 if remote.checkpoint.startswith("s3a:") else 1)
    assert local_h["timeResolutionMs"] == 1
    durations = [b["durationMs"] for b in h["batches"]]
    assert all(d is None or d >= 0 for d in durations), durations
    assert None not in durations or remote.checkpoint.startswith("s3a:"), durations
    # the rows the query's progress reported
    assert {b["batchId"]: [o["numRowsTotal"] for o in b["operators"]] for b in h["batches"]} \
        == {bid: [f["numRowsTotal"] for f in figs] for bid, figs in remote.figures.items()}


def test_export_then_sparks_operators_continue(spark, tmp_path, remote_checkpoints):
    """`state export` as users run it (a process of its own, a local Spark with the store's
    settings as --conf), then arrowstate off: Spark's operators continue the query with an
    uninterrupted native run's answers; arrowstate's files are moved aside on the store."""
    native = _native(spark, tmp_path)
    said = {}

    def export(checkpoint):
        said.update(state_command("export", checkpoint, cli=True))
        spark.conf.set("spark.arrowstate.enabled", "false")

    ours = _ours(spark, tmp_path, True, export)
    _on(remote_checkpoints, ours.checkpoint)
    assert said["session"] == "local"
    assert [(c["operator_id"], c["version"]) for c in said["exported"]] == [(0, 3), (1, 3)]
    assert all(c["rows"] > 0 for c in said["exported"])
    assert ours.outputs == native.outputs
    assert ours.figures == native.figures
    assert "Arrow" in ours.plans[0] and "Arrow" not in ours.plans[-1], ours.plans
    files = files_for(ours.checkpoint)
    assert files.isdir(os.path.join(ours.checkpoint, "arrowstate-exported-3", "state", "0"))
    assert [o["engine"] for o in describe(ours.checkpoint)["operators"]] == ["spark-hdfs"] * 2


def test_import_of_a_checkpoint_spark_wrote(spark, tmp_path, remote_checkpoints):
    """`state import` (in this process: a new session of the tests' Spark) of the state
    Spark's operators wrote on the store, then arrowstate on: it continues with Spark's
    answers."""
    native = _native(spark, tmp_path)
    said = {}

    def import_(checkpoint):
        said.update(state_command("import", checkpoint))
        spark.conf.set("spark.arrowstate.enabled", "true")

    ours = _ours(spark, tmp_path, False, import_)
    _on(remote_checkpoints, ours.checkpoint)
    assert said["session"] == "active"
    assert [(c["operator_id"], c["version"]) for c in said["imported"]] == [(0, 3), (1, 3)]
    assert ours.outputs == native.outputs
    assert ours.figures == native.figures
    assert "Arrow" not in ours.plans[0] and "Arrow" in ours.plans[-1], ours.plans
    assert files_for(ours.checkpoint).isdir(
        os.path.join(ours.checkpoint, "spark-state-imported-3", "state", "1"))


def test_repartition(spark, tmp_path, remote_checkpoints):
    """`state repartition` into 3 partitions on the store: the state reads as before it,
    the query continues on 3 partitions, and every batch after gives Spark's rows and state
    figures (one batch later: the repartition is a batch of its own)."""
    native = _native(spark, tmp_path)
    said = {}

    def repartition(checkpoint):
        before = _rows(spark, checkpoint)
        said.update(state_command("repartition", checkpoint, "3"))
        said["same state"] = _rows(spark, checkpoint) == before != []

    ours = _ours(spark, tmp_path, True, repartition)
    _on(remote_checkpoints, ours.checkpoint)
    assert [len(r["rows"]) for r in said["repartitioned"]] == [3, 3]
    assert said["same state"]
    assert [o["partitions"] for o in describe(ours.checkpoint)["operators"]] == [3, 3]
    # batch RESTART + 1 is the repartition's: the batches after it are native's one later
    shifted = {b + 1 if b > RESTART else b: rows for b, rows in native.outputs.items()}
    assert ours.outputs == shifted
    assert ours.figures == {b + 1 if b > RESTART else b: f for b, f in native.figures.items()}
    assert _rows(spark, ours.checkpoint) == _rows(spark, native.checkpoint)


def test_leaving_arrowstate_at_planning(spark, tmp_path, remote_checkpoints):
    """Restarted with arrowstate off, the query converts its state on the store at planning
    (a process on the driver, through the planning query's session and its filesystem
    settings) and continues on Spark's operators with an uninterrupted native run's
    answers."""
    native = _native(spark, tmp_path)

    def switch_off(checkpoint):
        spark.conf.set("spark.arrowstate.enabled", "false")

    ours = _ours(spark, tmp_path, True, switch_off)
    _on(remote_checkpoints, ours.checkpoint)
    assert ours.outputs == native.outputs
    assert ours.figures == native.figures
    assert "runs in arrowstate" in ours.plans[0], ours.plans[0]
    assert "runs in arrowstate" not in ours.plans[-1], ours.plans[-1]
    moved = [n for n in files_for(ours.checkpoint).listdir(ours.checkpoint)
             if n.startswith("arrowstate-exported-")]
    assert moved == ["arrowstate-exported-3"]
    assert [o["engine"] for o in describe(ours.checkpoint)["operators"]] == ["spark-hdfs"] * 2


def test_files_on_the_store_are_written_whole_and_replaced(spark, remote_checkpoints):
    """What the tools do to files there beyond a query's own writes: a file written over (an
    offset log entry a conversion rewrites) and renamed over another, read whole and by its
    tail, listed, sized and removed."""
    root = harness.checkpoint_root(f"files-{os.getpid()}")
    files = files_for(root)
    path = os.path.join(root, "a", "1")
    files.write_atomic(path, b"one")
    files.write_atomic(path, b"two")
    assert files.read_text(path) == "two" and files.listdir(os.path.join(root, "a")) == ["1"]
    files.write_atomic(os.path.join(root, "2"), b"three")
    files.rename(os.path.join(root, "2"), path)
    assert files.read_bytes(path) == b"three" and files.tail(path, 2) == b"ee"
    assert files.file_sizes(root) == {} and files.isdir(os.path.join(root, "a"))
    assert files.tree_size(root) == 5 and files.modified_ms(path) > 0
    assert files.absolute(path) == path
    files.remove(path)
    files.remove(path)   # a missing file: no error
    assert not files.exists(path)
    with pytest.raises(FileNotFoundError):
        files.read_bytes(path)
