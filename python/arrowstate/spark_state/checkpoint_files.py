"""A streaming checkpoint's files, as Spark names and writes them, read (and the logs
written): `commits/<batch>`, `offsets/<batch>` (with the SQL
settings a restart keeps), `state/<op>/_metadata/metadata` (operator metadata v1: name,
stores, partitions; transformWithState writes v2 entries, `_metadata/v2/<batch>`),
`state/<op>/<partition>/_metadata/schema` (state schema v1 or v2: the key and value schemas
as JSON), `state/<op>/_stateSchema/<store>/<batch>_<uuid>` (state schema v3,
transformWithState's: per column family its key and value schemas) and the partition
directories with the engine's files: arrowstate's `<v>.arrowstate.delta|snapshot`, Spark's
HDFS-backed store's `<v>.delta|snapshot`, RocksDB's `<v>.zip|changelog` and `SSTs/`. Read and
written on whatever filesystem holds the checkpoint (filesystems.files_for).
"""
from __future__ import annotations

import json
import os
import struct

from ..store.formats import names as file_names
from .filesystems import CheckpointError, files_for

ARROWSTATE, HDFS, ROCKSDB = "arrowstate", "spark-hdfs", "spark-rocksdb"
# where `state export` and `import` move the old engine's files: `<prefix><version>/state/`
EXPORTED, IMPORTED = "arrowstate-exported-", "spark-state-imported-"
MOVED_ASIDE = (EXPORTED, IMPORTED)
_ENGINE = dict(zip(file_names.SPARK_STORES, (HDFS, ROCKSDB)))


class PartitionFiles:
    """One partition directory of a checkpoint, as the store's FileSource."""

    def __init__(self, where: str, context: str) -> None:
        self.where, self.context = where, context
        self._files = files_for(where)

    def names(self) -> list[str]:
        return self._files.listdir(self.where)

    def read(self, name: str) -> bytes | memoryview:
        return self._files.read_mapped(os.path.join(self.where, name))

    def tail(self, name: str, size: int) -> bytes:
        return self._files.tail(os.path.join(self.where, name), size)


def _read_utf(b: bytes, i: int) -> tuple[str, int]:
    n = struct.unpack(">H", b[i:i + 2])[0]
    return b[i + 2:i + 2 + n].decode(), i + 2 + n


def read_state_schema_file(path: str) -> tuple[dict, dict]:
    """Key and value schemas (Spark's JSON) of a state schema file, format v1 or v2."""
    b = files_for(path).read_bytes(path)
    version, i = _read_utf(b, 0)
    if version not in ("v1", "v2"):
        raise CheckpointError(f"{path}: state schema file format {version} is not one this "
                              "arrowstate reads (v1, v2)")
    schemas = []
    for _ in range(2):
        text, i = _read_utf(b, i) if version == "v1" else _read_chunked(b, i)
        schemas.append(json.loads(text))
    return schemas[0], schemas[1]


def _read_chunked(b: bytes, i: int) -> tuple[str, int]:
    chunks = struct.unpack(">i", b[i:i + 4])[0]
    i += 4
    text = ""
    for _ in range(chunks):
        part, i = _read_utf(b, i)
        text += part
    return text, i


def read_column_family_schemas(path: str) -> dict[str, tuple[dict, dict]]:
    """Per column family, its key and value schemas (Spark's JSON), from a state schema v3
    file: the count of column families, then each one's name, key schema and value schema
    (each after a 2-byte schema id), key encoder spec and user key encoder schema."""
    b = files_for(path).read_bytes(path)
    try:
        version, i = _read_utf(b, 0)
        if version != "v3":
            raise CheckpointError(f"{path}: state schema file format {version}, not v3")
        count = struct.unpack(">i", b[i:i + 4])[0]
        i += 4
        found = {}
        for _ in range(count):
            name, i = _read_utf(b, i)
            key, i = _read_chunked(b, i + 2)
            value, i = _read_chunked(b, i + 2)
            _, i = _read_chunked(b, i)   # the key encoder spec
            _, i = _read_chunked(b, i)   # the user key encoder schema
            found[name] = (json.loads(key), json.loads(value))
        return found
    except (struct.error, UnicodeDecodeError, ValueError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{path}: cannot read the state schema (v3) file: {e}") from e


def log_ids(checkpoint: str, log: str) -> list[int]:
    """The batches a log (`commits`, `offsets`) has an entry of, in order."""
    where, files = os.path.join(checkpoint, log), files_for(checkpoint)
    return sorted(int(n) for n in files.listdir(where) if n.isdigit()) \
        if files.isdir(where) else []


def committed_checkpoint_ids(checkpoint: str, operator: int) -> dict[int, list[str | None]]:
    """Checkpoint format v2: per state version, the checkpoint id Spark's commit log
    recorded for each partition of the operator (batch N commits version N + 1); the
    versions whose entry records none (format v1) are left out. The files of those ids are
    the ones the version is (`store.lineage`)."""
    found: dict[int, list[str | None]] = {}
    files = files_for(checkpoint)
    for batch in log_ids(checkpoint, "commits"):
        lines = files.read_text(os.path.join(checkpoint, "commits", str(batch))).splitlines()
        try:
            ids = json.loads(lines[1]).get("stateUniqueIds") or {}
        except (IndexError, ValueError):
            continue
        partitions = ids.get(str(operator))
        if partitions:
            found[batch + 1] = [p[0] if p else None for p in partitions]
    return found


def last_committed_batch(checkpoint: str) -> int | None:
    return max(log_ids(checkpoint, "commits"), default=None)


def planned_batch(checkpoint: str) -> int | None:
    return max(log_ids(checkpoint, "offsets"), default=None)


def offset_conf(checkpoint: str, batch: int) -> dict:
    """The SQL settings the offset log recorded for `batch` (those a restart keeps)."""
    path = os.path.join(checkpoint, "offsets", str(batch))
    try:
        lines = files_for(path).read_text(path).splitlines()
        return json.loads(lines[1]).get("conf", {})
    except (OSError, IndexError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot read the offset log entry: {e}") from e


def operator_metadata(op_dir: str) -> dict | None:
    """The operator's metadata: v1 (`_metadata/metadata`), or the newest v2 entry
    (`_metadata/v2/<batch>`, which transformWithState writes)."""
    files = files_for(op_dir)
    paths = [os.path.join(op_dir, "_metadata", "metadata")]
    v2 = os.path.join(op_dir, "_metadata", "v2")
    if files.isdir(v2):
        paths += [os.path.join(v2, str(b)) for b in
                  sorted((int(n) for n in files.listdir(v2) if n.isdigit()), reverse=True)[:1]]
    for path in paths:
        if files.exists(path):
            lines = files.read_text(path).splitlines()
            if len(lines) > 1 and lines[0] in ("v1", "v2"):
                return json.loads(lines[1])
    return None


def partition_engine(names: list[str]) -> tuple[str | None, int]:
    """Whose files a partition directory holds, and the newest version among them."""
    ours = [p for p in map(file_names.parse_name, names) if p is not None]
    native = {_ENGINE[store]: versions
              for store, versions in file_names.spark_store_files(names).items()}
    engines = [e for e, found in ((ARROWSTATE, ours), *native.items()) if found]
    if "SSTs" in names and ROCKSDB not in engines:
        engines.append(ROCKSDB)
    versions = [v for v, _ in ours] + [v for found in native.values() for v in found]
    return (None if not engines else "+".join(engines)), max(versions, default=0)


def write_log_entry(path: str, text: str) -> None:
    """A new offsets/ or commits/ entry, written whole or not at all."""
    files_for(path).write_atomic(path, text.encode())


def offsets_with_conf(checkpoint: str, batch: int, changes: dict) -> str:
    """offsets/`batch`'s text with `changes` made to the settings it records."""
    path = os.path.join(checkpoint, "offsets", str(batch))
    lines = files_for(path).read_text(path).split("\n")
    meta = json.loads(lines[1])
    meta["conf"].update(changes)
    lines[1] = json.dumps(meta, separators=(",", ":"))
    return "\n".join(lines)
