"""Where the bench's queries keep their checkpoints (`--checkpoint local|hdfs|s3`): the local
disk, or the tests' HDFS (Hadoop's MiniDFSCluster) or S3-compatible store (SeaweedFS through
`s3a://`), started here on loopback (tests/helpers/storage.py), and the requests each run
makes to the object store, so that a figure says on which storage it was measured and what
it cost there."""
from __future__ import annotations

import os
import shutil
import tempfile
import uuid


class Checkpoints:
    def __init__(self, kind: str):
        self.kind = kind
        self.store = None
        self.jars: list[str] = []
        if kind == "local":
            return
        import storage   # tests/helpers, on the path bench.py sets

        jars = storage.storage_jars()
        self.jars = jars["s3a"]
        self.store = (storage.Hdfs(jars["minicluster"]) if kind == "hdfs"
                      else storage.ObjectStore()).start()

    def spark_settings(self) -> dict[str, str]:
        """Settings for the bench's session (before it starts)."""
        if self.store is None:
            return {}
        # Hadoop's default input stream (the analytics one), as users read
        settings = (self.store.spark_settings(input_stream=None) if self.kind == "s3"
                    else self.store.spark_settings())
        return {"spark.driver.extraClassPath": ":".join(self.jars), **settings}

    def new(self) -> str:
        if self.store is None:
            return tempfile.mkdtemp(prefix="bench-ck-")
        return self.store.uri(f"bench/{uuid.uuid4().hex[:12]}/ck")

    def remove(self, checkpoint: str) -> None:
        # remote ones go with the store's directory when it stops
        if self.store is None:
            shutil.rmtree(checkpoint, ignore_errors=True)

    def requests(self) -> dict[str, int]:
        """The object store's requests so far, by type, or the name node's calls, by
        method (none counted on the local disk)."""
        return self.store.requests() if self.store is not None else {}

    def stop(self) -> None:
        if self.store is not None:
            self.store.stop()


def per_batch(before: dict[str, int], after: dict[str, int], batches: int) -> dict:
    """Requests a run made, by type, per micro-batch."""
    return {k: round((after.get(k, 0) - before.get(k, 0)) / max(batches, 1), 1)
            for k in sorted(set(after) | set(before)) if after.get(k, 0) != before.get(k, 0)}


def state_files(spark, checkpoint: str) -> dict[str, int]:
    """Every file under the checkpoint's `state/` with its size (the local disk's calls
    there, Hadoop's FileSystem through the session elsewhere)."""
    root = os.path.join(checkpoint, "state")
    if "://" not in checkpoint:
        return {os.path.join(d, n): os.path.getsize(os.path.join(d, n))
                for d, _, names in os.walk(root) for n in names}
    jvm = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(root)
    fs = path.getFileSystem(spark._jsparkSession.sessionState().newHadoopConf())
    if not fs.exists(path):
        return {}
    found, files = {}, fs.listFiles(path, True)
    while files.hasNext():
        status = files.next()
        found[status.getPath().toString()] = status.getLen()
    return found


def written_between(before: dict[str, int], after: dict[str, int]) -> tuple[int, int]:
    """The files new (or changed) from one listing of state_files to the next: how many,
    and their bytes."""
    new = [size for name, size in after.items() if before.get(name) != size]
    return len(new), sum(new)
