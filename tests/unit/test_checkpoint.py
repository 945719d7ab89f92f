"""`python -m arrowstate state describe`: which engine's files a partition holds, and bad
input."""
import subprocess
import sys

import pytest

from arrowstate.spark_state import partition_engine


def test_partition_engines_are_told_by_their_files():
    assert partition_engine(["1.arrowstate.delta", "2.arrowstate.snapshot"]) == ("arrowstate", 2)
    assert partition_engine(["1.delta", "2.delta", "_metadata"]) == ("spark-hdfs", 2)
    assert partition_engine(["3.zip", "4.changelog", "SSTs"]) == ("spark-rocksdb", 4)
    assert partition_engine(["1.delta", "2.arrowstate.delta"]) == ("arrowstate+spark-hdfs", 2)
    assert partition_engine(["_metadata"]) == (None, 0)


def test_state_describe_refuses_what_is_not_a_checkpoint(tmp_path):
    done = subprocess.run([sys.executable, "-m", "arrowstate", "state", "describe",
                           str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "not a streaming checkpoint (no offsets/)" in done.stderr
    done = subprocess.run([sys.executable, "-m", "arrowstate", "state", "describe",
                           str(tmp_path / "missing")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "no such directory" in done.stderr


def _logs(tmp_path, offsets, commits):
    for log, ids in (("offsets", offsets), ("commits", commits)):
        (tmp_path / log).mkdir()
        for i in ids:
            (tmp_path / log / str(i)).write_text("v1\n{}\n")


def test_a_conversion_refuses_a_running_query_but_the_one_planning_it(tmp_path):
    """export's --planning-batch: the shim converts while its query plans batch N (offsets/N
    written, no commit), and only then; a batch planned further on, or another query
    planning, is refused as ever."""
    from arrowstate.spark_state.conversion import CheckpointError, refuse_running
    _logs(tmp_path, offsets=[0, 1, 2], commits=[0, 1])
    refuse_running(str(tmp_path), 1, planning=2)
    for planning in (None, 1, 3):
        with pytest.raises(CheckpointError, match="batch 2 is planned"):
            refuse_running(str(tmp_path), 1, planning)
    first = tmp_path / "first"
    first.mkdir()
    _logs(first, offsets=[0], commits=[])
    refuse_running(str(first), None, planning=0)   # batch 0: nothing committed before it


def test_checkpoints_off_the_local_disk_are_told_by_their_scheme():
    from arrowstate.spark_state.filesystems import LOCAL, files_for, is_remote
    for remote in ("s3a://bucket/ck", "hdfs://nn:8020/ck", "hdfs:/ck", "abfss://c@a.dfs/ck"):
        assert is_remote(remote), remote
    for local in ("/tmp/ck", "ck", "file:/tmp/ck", "file:///tmp/ck", "./a:b", "C:/ck"):
        assert not is_remote(local) and files_for(local) is LOCAL, local


def test_a_remote_checkpoint_without_a_spark_session_is_refused_with_the_reason(monkeypatch):
    """Spark-free: no session to reach the filesystem through (the command line starts
    one; a Python caller needs an active one). In the suite this process may hold the Spark
    tests' session: none counts as active here."""
    from pyspark.sql import SparkSession

    from arrowstate.spark_state import CheckpointError, describe
    monkeypatch.setattr(SparkSession, "getActiveSession", classmethod(lambda cls: None))
    with pytest.raises(CheckpointError, match="s3a://b/ck: a checkpoint on s3a is read "
                                              "through Hadoop's FileSystem"):
        describe("s3a://b/ck")


def test_local_files_are_written_whole_and_renamed_over(tmp_path):
    from arrowstate.spark_state.filesystems import LOCAL
    path = str(tmp_path / "a" / "b" / "1")
    LOCAL.write_atomic(path, b"one")
    LOCAL.write_atomic(path, b"two")
    assert LOCAL.read_text(path) == "two" and LOCAL.listdir(str(tmp_path / "a" / "b")) == ["1"]
    LOCAL.write_atomic(str(tmp_path / "2"), b"three")
    LOCAL.rename(str(tmp_path / "2"), path)
    assert LOCAL.read_bytes(path) == b"three" and LOCAL.tail(path, 2) == b"ee"
    assert LOCAL.file_sizes(str(tmp_path)) == {} and LOCAL.tree_size(str(tmp_path)) == 5
    LOCAL.remove(path)
    LOCAL.remove(path)   # a missing file: no error
    assert not LOCAL.exists(path)
