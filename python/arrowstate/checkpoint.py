"""A streaming checkpoint's state, read offline (no Spark, local filesystem): per stateful
operator, its family, partitions, newest version, rows, bytes on disk, key and value
schemas and the engine whose files hold it (`python -m arrowstate state describe`).

The layout is Spark's: `commits/<batch>`, `state/<op>/_metadata/metadata` (operator
metadata v1: name, stores, partitions), `state/<op>/<partition>/_metadata/schema` (state
schema v2: the key and value schemas as JSON) and the partition directories with the
engine's files: arrowstate's `<v>.arrowstate.delta|snapshot`, Spark's HDFS-backed store's
`<v>.delta|snapshot`, RocksDB's `<v>.zip|changelog` and `SSTs/`.
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import asdict, dataclass, field

from .store import VersionedState
from .store import files as store_files

ARROWSTATE, HDFS, ROCKSDB = "arrowstate", "spark-hdfs", "spark-rocksdb"
_ENGINE = dict(zip(store_files.SPARK_STORES, (HDFS, ROCKSDB)))
# Spark's operator names (operator metadata) and the arrowstate family that runs them
FAMILIES = {"dedupe": "deduplicate", "dedupeWithinWatermark": "deduplicate",
            "stateStoreSave": "aggregate", "applyInPandasWithState": "flatMapGroupsWithState"}


class CheckpointError(ValueError):
    """A checkpoint that cannot be described; the message says what and where."""


class LocalFiles:
    """One partition directory on the local filesystem, as the store's FileSource."""

    def __init__(self, where: str, context: str) -> None:
        self.where, self.context = where, context

    def names(self) -> list[str]:
        return os.listdir(self.where)

    def read(self, name: str) -> bytes:
        with open(os.path.join(self.where, name), "rb") as f:
            return f.read()

    def tail(self, name: str, size: int) -> bytes:
        return self.read(name)[-size:]


@dataclass
class Operator:
    operator_id: int
    name: str
    family: str | None
    engine: str
    partitions: int
    newest_version: int
    rows: int | None
    bytes_on_disk: int
    key_schema: str | None
    value_schema: str | None
    stores: list[str] = field(default_factory=list)
    note: str | None = None


def _read_utf(b: bytes, i: int) -> tuple[str, int]:
    n = struct.unpack(">H", b[i:i + 2])[0]
    return b[i + 2:i + 2 + n].decode(), i + 2 + n


def read_schema_file(path: str) -> tuple[dict, dict]:
    """Key and value schemas (Spark's JSON) of a state schema file, format v1 or v2."""
    with open(path, "rb") as f:
        b = f.read()
    version, i = _read_utf(b, 0)
    if version not in ("v1", "v2"):
        raise CheckpointError(f"{path}: state schema file format {version} is not one this "
                              "arrowstate reads (v1, v2)")
    schemas = []
    for _ in range(2):
        if version == "v1":
            text, i = _read_utf(b, i)
        else:
            chunks = struct.unpack(">i", b[i:i + 4])[0]
            i += 4
            text = ""
            for _ in range(chunks):
                part, i = _read_utf(b, i)
                text += part
        schemas.append(json.loads(text))
    return schemas[0], schemas[1]


def _simple(schema: dict) -> str:
    from pyspark.sql.types import StructType
    return StructType.fromJson(schema).simpleString()


def last_committed_batch(checkpoint: str) -> int | None:
    commits = os.path.join(checkpoint, "commits")
    ids = [int(n) for n in os.listdir(commits) if n.isdigit()] if os.path.isdir(commits) else []
    return max(ids, default=None)


def partition_engine(names: list[str]) -> tuple[str | None, int]:
    """Whose files a partition directory holds, and the newest version among them."""
    ours = [p for p in map(store_files.parse_name, names) if p is not None]
    native = {_ENGINE[store]: versions
              for store, versions in store_files.spark_store_files(names).items()}
    engines = [e for e, found in ((ARROWSTATE, ours), *native.items()) if found]
    if "SSTs" in names and ROCKSDB not in engines:
        engines.append(ROCKSDB)
    versions = [v for v, _ in ours] + [v for found in native.values() for v in found]
    return (None if not engines else "+".join(engines)), max(versions, default=0)


def _size(path: str) -> int:
    total = 0
    for root, _, names in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, n)) for n in names)
    return total


def describe(checkpoint: str) -> dict:
    """What the checkpoint's state is, per operator (see the module's docstring)."""
    state_root = os.path.join(checkpoint, "state")
    if not os.path.isdir(checkpoint):
        raise CheckpointError(f"{checkpoint}: no such directory")
    if not os.path.isdir(os.path.join(checkpoint, "offsets")):
        raise CheckpointError(f"{checkpoint}: not a streaming checkpoint (no offsets/)")
    last = last_committed_batch(checkpoint)
    operators = []
    op_ids = sorted(int(n) for n in os.listdir(state_root) if n.isdigit()) \
        if os.path.isdir(state_root) else []
    for op in op_ids:
        operators.append(_describe_operator(checkpoint, op, last))
    return {"checkpoint": os.path.abspath(checkpoint), "lastCommittedBatch": last,
            "operators": [asdict(o) for o in operators]}


def _describe_operator(checkpoint: str, op: int, last: int | None) -> Operator:
    op_dir = os.path.join(checkpoint, "state", str(op))
    name, stores, declared = "unknown", ["default"], None
    meta = os.path.join(op_dir, "_metadata", "metadata")
    if os.path.exists(meta):
        with open(meta) as f:
            lines = f.read().splitlines()
        if lines and lines[0] == "v1" and len(lines) > 1:
            info = json.loads(lines[1])
            name = info["operatorInfo"]["operatorName"]
            stores = [s["storeName"] for s in info["stateStoreInfo"]]
            declared = max((s["numPartitions"] for s in info["stateStoreInfo"]), default=None)
    parts = sorted(int(n) for n in os.listdir(op_dir) if n.isdigit())
    engines, newest = set(), 0
    for p in parts:
        engine, version = partition_engine(os.listdir(os.path.join(op_dir, str(p))))
        if engine:
            engines.add(engine)
        newest = max(newest, version)
    engine = "+".join(sorted(engines)) or "none"
    key_schema = value_schema = None
    schema_file = os.path.join(op_dir, "0", "_metadata", "schema")
    if os.path.exists(schema_file):
        key, value = read_schema_file(schema_file)
        key_schema, value_schema = _simple(key), _simple(value)
    version = None if last is None else last + 1
    rows, note = None, None
    if engine == ARROWSTATE and version is not None:
        rows = sum(_arrowstate_rows(os.path.join(op_dir, str(p)), op, p, version)
                   for p in parts)
    elif engine not in ("none", ARROWSTATE):
        note = ("rows are counted for arrowstate state only; for Spark's own state, "
                "spark.read.format('statestore') counts them")
    return Operator(op, name, FAMILIES.get(name), engine, declared or len(parts),
                    newest, rows, _size(op_dir), key_schema, value_schema, stores, note)


def _arrowstate_rows(where: str, op: int, partition: int, version: int) -> int:
    from .state_data import stored_schema
    source = LocalFiles(where, f"operator {op}, partition {partition}, version {version}")
    if not any(store_files.parse_name(n) for n in source.names()):
        return 0
    fields = list(stored_schema(source, version))
    key_count = sum(1 for f in fields if f.name.startswith("k"))   # k0.. then v0..
    state = VersionedState(fields[:key_count], fields[key_count:])
    state.load(source, version)
    return len(state)


def format_text(described: dict) -> str:
    lines = [f"checkpoint {described['checkpoint']} (last committed batch "
             f"{described['lastCommittedBatch']})"]
    if not described["operators"]:
        lines.append("  no stateful operators")
    for o in described["operators"]:
        family = f" (arrowstate family {o['family']})" if o["family"] else ""
        rows = "n/a" if o["rows"] is None else o["rows"]
        lines += [f"operator {o['operator_id']}: {o['name']}{family}",
                  f"  engine: {o['engine']} | partitions: {o['partitions']} | newest version: "
                  f"{o['newest_version']} | rows: {rows} | bytes on disk: {o['bytes_on_disk']}",
                  f"  key:   {o['key_schema']}", f"  value: {o['value_schema']}"]
        if o["note"]:
            lines.append(f"  note: {o['note']}")
    return "\n".join(lines)


HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"


def offset_conf(checkpoint: str, batch: int) -> dict:
    """The SQL settings the offset log recorded for `batch` (those a restart keeps)."""
    path = os.path.join(checkpoint, "offsets", str(batch))
    try:
        with open(path) as f:
            lines = f.read().splitlines()
        return json.loads(lines[1]).get("conf", {})
    except (OSError, IndexError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot read the offset log entry: {e}") from e


def _refuse_running(checkpoint: str, last: int | None) -> None:
    offsets = os.path.join(checkpoint, "offsets")
    planned = max((int(n) for n in os.listdir(offsets) if n.isdigit()), default=None)
    if planned is not None and (last is None or planned > last):
        raise CheckpointError(
            f"{checkpoint}: batch {planned} is planned (offsets/{planned}) but not committed: "
            "a query is running on this checkpoint, or stopped in the middle of a batch. "
            "Stop the query; if it had stopped mid-batch, run it to the end of a batch first.")


def export_to_spark(checkpoint: str) -> dict:
    """Converts every arrowstate operator's state to Spark's HDFS-backed state store format
    (the newest committed version, as `<v>.snapshot` per partition), so that the query
    continues on Spark's own operators. arrowstate's files are moved, once every snapshot is
    written, to `<checkpoint>/arrowstate-exported-<v>/`. Running it again does nothing."""
    described = describe(checkpoint)
    last = described["lastCommittedBatch"]
    ours = [o for o in described["operators"] if ARROWSTATE in o["engine"].split("+")]
    if not ours:
        return {"checkpoint": described["checkpoint"], "exported": [],
                "message": "no arrowstate state in this checkpoint: nothing to export"}
    _refuse_running(checkpoint, last)
    conf = offset_conf(checkpoint, last)
    provider = conf.get("spark.sql.streaming.stateStore.providerClass", HDFS_PROVIDER)
    if provider != HDFS_PROVIDER:
        raise CheckpointError(
            f"{checkpoint}: the query's state store provider is {provider} (offsets/{last}); "
            f"export writes the format of {HDFS_PROVIDER} only")
    if conf.get("spark.sql.streaming.stateStore.rowChecksum.enabled") == "true":
        raise CheckpointError(f"{checkpoint}: the query stores row checksums "
                              "(spark.sql.streaming.stateStore.rowChecksum.enabled=true); "
                              "export does not write them")
    for o in ours:
        if o["stores"] != ["default"]:
            raise CheckpointError(f"{checkpoint}: operator {o['operator_id']} has state stores "
                                  f"{o['stores']}; export handles the default store only")
    version = last + 1
    codec = conf.get("spark.sql.streaming.stateStore.compression.codec", "lz4")
    spark = _local_spark("arrowstate state export",
                         {"spark.sql.streaming.stateStore.compression.codec": codec})
    state_root = os.path.abspath(os.path.join(checkpoint, "state"))
    exported = []
    try:
        conversion = spark._jvm.org.apache.spark.sql.arrowstate.StateConversion
        for o in ours:
            key, value = read_schema_file(
                os.path.join(state_root, str(o["operator_id"]), "0", "_metadata", "schema"))
            rows = conversion.exportOperator(spark._jsparkSession, state_root,
                                             o["operator_id"], o["partitions"], version,
                                             json.dumps(key), json.dumps(value))
            exported.append({"operator_id": o["operator_id"], "version": version,
                             "rows": sum(rows)})
    finally:
        spark.stop()
    backup = os.path.join(checkpoint, f"arrowstate-exported-{version}")
    _move_aside(checkpoint, [o["operator_id"] for o in ours], backup,
                lambda name: store_files.parse_name(name) is not None)
    return {"checkpoint": described["checkpoint"], "exported": exported,
            "message": f"arrowstate's files were moved to {backup}"}


def _local_spark(app: str, conf: dict):
    from pyspark.sql import SparkSession

    from . import configure
    builder = (SparkSession.builder.master("local[2]").appName(app)
               .config("spark.ui.enabled", "false"))
    for k, v in conf.items():
        builder = builder.config(k, v)
    return configure(builder).getOrCreate()


def _move_aside(checkpoint: str, operators: list[int], backup: str, is_moved) -> None:
    """Moves the files `is_moved` picks from the operators' partition directories (and their
    checksum files) to the same places under `backup`."""
    state_root = os.path.join(checkpoint, "state")
    for op in operators:
        op_dir = os.path.join(state_root, str(op))
        for p in (n for n in os.listdir(op_dir) if n.isdigit()):
            src = os.path.join(op_dir, p)
            for name in os.listdir(src):
                if is_moved(name.lstrip(".").removesuffix(".crc")):
                    dst = os.path.join(backup, "state", str(op), p)
                    os.makedirs(dst, exist_ok=True)
                    os.replace(os.path.join(src, name), os.path.join(dst, name))


def import_from_spark(checkpoint: str, time_zone: str | None = None) -> dict:
    """Converts the state Spark's own store (HDFS-backed) holds for the operators arrowstate
    runs to arrowstate's format (the newest committed version, as one snapshot per
    partition), so that the query continues on arrowstate. Spark's files are moved, once
    every snapshot is written, to `<checkpoint>/spark-state-imported-<v>/`. Timestamps in
    the state take `time_zone` (the session time zone the query runs with; this machine's
    by default). Running it again does nothing."""
    described = describe(checkpoint)
    last = described["lastCommittedBatch"]
    theirs = [o for o in described["operators"]
              if o["engine"] != "none" and ARROWSTATE not in o["engine"].split("+")]
    unknown = [o for o in theirs if o["family"] is None]
    if unknown:
        raise CheckpointError(
            f"{checkpoint}: operator {unknown[0]['operator_id']} ({unknown[0]['name']}) is "
            "not one arrowstate runs; its state stays Spark's (nothing was converted)")
    if not theirs:
        return {"checkpoint": described["checkpoint"], "imported": [],
                "message": "no Spark state store state in this checkpoint: nothing to import"}
    _refuse_running(checkpoint, last)
    conf = offset_conf(checkpoint, last)
    provider = conf.get("spark.sql.streaming.stateStore.providerClass", HDFS_PROVIDER)
    for o in theirs:
        if o["stores"] != ["default"]:
            raise CheckpointError(f"{checkpoint}: operator {o['operator_id']} has state stores "
                                  f"{o['stores']}; import handles the default store only")
    version = last + 1
    session_conf = {k: v for k, v in conf.items() if k.startswith("spark.sql.streaming.")}
    spark = _local_spark("arrowstate state import", session_conf)
    state_root = os.path.abspath(os.path.join(checkpoint, "state"))
    imported = []
    try:
        zone = time_zone or spark.conf.get("spark.sql.session.timeZone")
        conversion = spark._jvm.org.apache.spark.sql.arrowstate.StateConversion
        for o in theirs:
            key, value = read_schema_file(
                os.path.join(state_root, str(o["operator_id"]), "0", "_metadata", "schema"))
            rows = conversion.importOperator(spark._jsparkSession, state_root,
                                             o["operator_id"], o["partitions"], version,
                                             json.dumps(key), json.dumps(value), provider, zone)
            imported.append({"operator_id": o["operator_id"], "version": version,
                             "rows": sum(rows)})
    finally:
        spark.stop()
    backup = os.path.join(checkpoint, f"spark-state-imported-{version}")
    _move_aside(checkpoint, [o["operator_id"] for o in theirs], backup,
                lambda name: bool(store_files.spark_store_files([name])))
    return {"checkpoint": described["checkpoint"], "imported": imported,
            "message": f"Spark's state files were moved to {backup}"}
