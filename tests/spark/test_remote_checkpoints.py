"""Checkpoints where users keep them: each family's differential test with its checkpoint on
HDFS (Hadoop's MiniDFSCluster) and on an S3-compatible object store through `s3a://`
(tests/helpers/storage.py), restarted, and its state read by Spark's `statestore` reader.

The whole differential suite runs on either store with ARROWSTATE_TEST_CHECKPOINTS=hdfs or
s3; this file is the subset CI runs every time."""
import datetime as dt

import pyarrow as pa
import pytest

from harness import assert_same, read_state

pytestmark = pytest.mark.slow

EVENTS = pa.schema([("user", pa.string()), ("ts", pa.timestamp("us", tz="UTC")),
                    ("v", pa.int64())])


def ev(user, second, v=0):
    return {"user": user, "ts": dt.datetime.fromtimestamp(second, dt.timezone.utc), "v": v}


BATCHES = [
    [ev("a", 10, 1), ev("b", 11, 2), ev("a", 12, 3)],
    [ev("a", 20, 4), ev("c", 40, 5), ev("d", 12, 6)],
    [],
    [ev("e", 5, 7), ev("f", 95, 8), ev("c", 41, 9)],
    [ev("g", 100, 10), ev("b", 101, 11)],
]


def _on(store, run) -> None:
    assert run.checkpoint.startswith(store.uri("")), run.checkpoint


def _same_state(spark, native, ours, batch: int) -> None:
    got = [read_state(spark, run.checkpoint, batch, {}) for run in (native, ours)]
    assert got[0] == got[1] and got[1], f"state at batch {batch} differs from Spark's"


def test_deduplication(spark, tmp_path, remote_checkpoints):
    native, ours = assert_same(
        spark, tmp_path, EVENTS, BATCHES,
        lambda df: df.withWatermark("ts", "10 seconds").dropDuplicates(["user", "ts"]),
        expect_node="ArrowStreamingDeduplicate", restart_after=[1, 3])
    _on(remote_checkpoints, ours)
    _same_state(spark, native, ours, 2)
