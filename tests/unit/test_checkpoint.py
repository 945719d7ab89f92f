"""`python -m arrowstate state describe`: which engine's files a partition holds, and bad
input."""
import subprocess
import sys

from arrowstate.checkpoint import partition_engine


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
