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

import contextlib
import json
import os
import struct
from dataclasses import asdict, dataclass, field

from . import tws_state
from .store import files as store_files

ARROWSTATE, HDFS, ROCKSDB = "arrowstate", "spark-hdfs", "spark-rocksdb"
_ENGINE = dict(zip(store_files.SPARK_STORES, (HDFS, ROCKSDB)))
# Spark's operator names (operator metadata) and the arrowstate family that runs them
FAMILIES = {"dedupe": "deduplicate", "dedupeWithinWatermark": "deduplicate",
            "stateStoreSave": "aggregate", "sessionWindowStateStoreSaveExec": "sessionWindow",
            "applyInPandasWithState": "flatMapGroupsWithState",
            "transformWithStateInPandasExec": "transformWithState",
            "transformWithStateInPySparkExec": "transformWithState"}


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
        operators.append(_describe_operator(checkpoint, op, last, _partitions(checkpoint,
                                                                             last)))
    return {"checkpoint": os.path.abspath(checkpoint), "lastCommittedBatch": last,
            "operators": [asdict(o) for o in operators]}


def _partitions(checkpoint: str, last: int | None) -> int | None:
    """The state partitions the query runs with now (a repartition changes them)."""
    if last is None:
        return None
    try:
        value = offset_conf(checkpoint, last).get("spark.sql.shuffle.partitions")
    except CheckpointError:
        return None
    return int(value) if value is not None else None


def _describe_operator(checkpoint: str, op: int, last: int | None,
                       active: int | None) -> Operator:
    op_dir = os.path.join(checkpoint, "state", str(op))
    name, stores, declared = "unknown", ["default"], None
    info = _operator_metadata(op_dir)
    if info is not None:
        name = info["operatorInfo"]["operatorName"]
        stores = [s["storeName"] for s in info["stateStoreInfo"]]
        declared = max((s["numPartitions"] for s in info["stateStoreInfo"]), default=None)
    parts = sorted(int(n) for n in os.listdir(op_dir) if n.isdigit())
    if active is not None:   # directories beyond are left from an earlier partitioning
        parts = [p for p in parts if p < active]
        declared = active
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
    elif info is not None and "operatorPropertiesJson" in info:   # column families
        variables = [v for v in json.loads(info["operatorPropertiesJson"]).get(
            "stateVariables", []) if v["stateVariableType"] != "TimerState"]
        value_schema = "state variables: " + (", ".join(
            f"{v['stateName']} ({v['stateVariableType']}{', TTL' if v['ttlEnabled'] else ''})"
            for v in variables) or "none")
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


def _operator_metadata(op_dir: str) -> dict | None:
    """The operator's metadata: v1 (`_metadata/metadata`), or the newest v2 entry
    (`_metadata/v2/<batch>`, which transformWithState writes)."""
    paths = [os.path.join(op_dir, "_metadata", "metadata")]
    v2 = os.path.join(op_dir, "_metadata", "v2")
    if os.path.isdir(v2):
        paths += [os.path.join(v2, str(b)) for b in
                  sorted((int(n) for n in os.listdir(v2) if n.isdigit()), reverse=True)[:1]]
    for path in paths:
        if os.path.exists(path):
            with open(path) as f:
                lines = f.read().splitlines()
            if len(lines) > 1 and lines[0] in ("v1", "v2"):
                return json.loads(lines[1])
    return None


def _arrowstate_rows(where: str, op: int, partition: int, version: int) -> int:
    from .state_data import stored_state
    source = LocalFiles(where, f"operator {op}, partition {partition}, version {version}")
    if not any(store_files.parse_name(n) for n in source.names()):
        return 0
    state = stored_state(source, version)
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


PROVIDER_SETTING = "spark.sql.streaming.stateStore.providerClass"
HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


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
    planned = _planned_batch(checkpoint)
    if planned is not None and (last is None or planned > last):
        raise CheckpointError(
            f"{checkpoint}: batch {planned} is planned (offsets/{planned}) but not committed: "
            "a query is running on this checkpoint, or stopped in the middle of a batch. "
            "Stop the query; if it had stopped mid-batch, run it to the end of a batch first.")


def _is_tws(o: dict) -> bool:
    return o["family"] == "transformWithState"


def _refuse_column_families(checkpoint: str, o: dict, last: int) -> None:
    """State in column families is converted for transformWithState and for nothing else;
    arrowstate's transformWithState state, while it holds no variable the processor no
    longer declares (the conversions read the declared ones)."""
    if o["key_schema"] is None and not _is_tws(o):
        raise CheckpointError(
            f"{checkpoint}: operator {o['operator_id']} ({o['name']}) keeps its state in "
            "column families, which this command does not convert yet; nothing was changed")
    kept = _undeclared_variables(checkpoint, o, last) if _is_tws(o) else []
    if kept:
        raise CheckpointError(
            f"{checkpoint}: operator {o['operator_id']} ({o['name']}) keeps the state of "
            f"variables {kept} that its processor no longer declares (as Spark keeps their "
            "column families), and this command converts declared variables only. Run the "
            "query once with a processor whose init() declares them again, or removes them "
            "with deleteIfExists; nothing was changed")


def _undeclared_variables(checkpoint: str, o: dict, last: int) -> list[str]:
    """The state variables arrowstate's files of the operator hold at batch `last` that
    the processor (its newest operator metadata) does not declare."""
    from .state_data import stored_schema
    if ARROWSTATE not in o["engine"].split("+"):
        return []
    op_dir = os.path.join(checkpoint, "state", str(o["operator_id"]))
    declared = {v["stateName"] for v in
                tws_state.operator_properties(op_dir, last)["stateVariables"]}
    held = set()
    for p in range(o["partitions"]):
        where = os.path.join(op_dir, str(p))
        source = LocalFiles(where, f"operator {o['operator_id']}, partition {p}")
        if os.path.isdir(where) and any(store_files.parse_name(n) for n in source.names()):
            held.update((f.metadata or {}).get(store_files.COLUMN_NAME, b"").decode()[2:]
                        for f in stored_schema(source, last + 1))
    return sorted(held - declared - {"", tws_state.TIMER_VARIABLE})


@contextlib.contextmanager
def _conversion_session(app: str, conf: dict):
    """The Spark session a conversion reads and writes state with. Called from a process
    whose active session runs arrowstate (a notebook, an application): a new session of its
    SparkContext, so no second Spark starts, with the checkpoint's store settings as its
    own. Else (the command line) a local Spark, started for it and stopped after."""
    from pyspark.sql import SparkSession

    from . import EXTENSION_CLASS, configure
    active = SparkSession.getActiveSession()
    if (getattr(active, "_jsparkSession", None) is not None
            and EXTENSION_CLASS in active.conf.get("spark.sql.extensions", "")):
        session = active.newSession()
        for k, v in conf.items():
            session.conf.set(k, v)
        jvm_session = session._jvm.org.apache.spark.sql.SparkSession
        jvm_session.setActiveSession(session._jsparkSession)   # what SQLConf.get reads
        try:
            yield session
        finally:
            jvm_session.setActiveSession(active._jsparkSession)
        return
    builder = (SparkSession.builder.master("local[2]").appName(app)
               .config("spark.ui.enabled", "false"))
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = configure(builder).getOrCreate()
    try:
        yield spark
    finally:
        spark.stop()


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


def _convert(checkpoint: str, direction: str, choose, check, session_conf, call,
             backup_prefix: str, is_moved) -> dict:
    """The shared steps of export and import: pick the operators (`choose`), refuse what
    cannot be converted (`check(conf, last, chosen, operators)`, given the offset log's
    settings; it returns the settings the conversion changes there, if any), write the other
    engine's snapshot of the newest committed version per operator through `call` in the
    session of
    `_conversion_session` (`call(conversion, session, state_root, operator, key_json,
    value_json, version, conf)` gives the rows per partition), then record the changed
    settings in the offset log's newest entry, and only then move the old engine's files
    aside."""
    described = describe(checkpoint)
    last = described["lastCommittedBatch"]
    chosen = [o for o in described["operators"] if choose(o)]
    if not chosen:
        return {"checkpoint": described["checkpoint"], direction: [],
                "message": f"no state to {direction.removesuffix('ed')} in this checkpoint: "
                           "nothing to do"}
    _refuse_running(checkpoint, last)
    conf = offset_conf(checkpoint, last)
    changed = check(conf, last, chosen, described["operators"])
    conf = {**conf, **changed}
    for o in chosen:
        if o["stores"] != ["default"]:
            raise CheckpointError(f"{checkpoint}: operator {o['operator_id']} has state stores "
                                  f"{o['stores']}; only the default store is converted")
        _refuse_column_families(checkpoint, o, last)
    version = last + 1
    state_root = os.path.abspath(os.path.join(checkpoint, "state"))
    converted = []
    with _conversion_session(f"arrowstate state {direction}", session_conf(conf)) as spark:
        conversion = spark._jvm.org.apache.spark.sql.arrowstate.StateConversion
        for o in chosen:
            key = value = None   # transformWithState: per state variable, read by `call`
            if not _is_tws(o):
                key, value = map(json.dumps, read_schema_file(os.path.join(
                    state_root, str(o["operator_id"]), "0", "_metadata", "schema")))
            rows = call(conversion, spark, state_root, o, key, value, version, conf)
            converted.append({"operator_id": o["operator_id"], "version": version,
                              "rows": sum(rows)})
    message = ""
    if changed:   # before the move: a failure in between leaves a run of this to redo
        offsets = os.path.join(checkpoint, "offsets")
        text = _offsets_with_conf(checkpoint, last, changed)
        with contextlib.suppress(FileNotFoundError):   # Hadoop's checksum of the old text
            os.remove(os.path.join(offsets, f".{last}.crc"))
        _write_log_entry(os.path.join(offsets, str(last)), text)
        message = "; offsets/{} now records {}".format(
            last, ", ".join(f"{k}={v}" for k, v in sorted(changed.items())))
    backup = os.path.join(checkpoint, f"{backup_prefix}-{version}")
    _move_aside(checkpoint, [o["operator_id"] for o in chosen], backup, is_moved)
    return {"checkpoint": described["checkpoint"], direction: converted,
            "message": f"the old engine's files were moved to {backup}{message}"}


def _store_settings(conf: dict) -> dict:
    """The state store settings the checkpoint's offset log records (provider, codec,
    RocksDB's), for the session that converts its state."""
    return {k: v for k, v in conf.items() if k.startswith("spark.sql.streaming.")}


def export_to_spark(checkpoint: str) -> dict:
    """Converts every arrowstate operator's state to the format of the Spark state store
    the checkpoint records (the newest committed version: HDFS-backed, `<v>.snapshot` per
    partition; RocksDB, a snapshot of that version written through its provider, and for
    transformWithState through Spark's own state variable implementations), so that the
    query continues on Spark's own operators. arrowstate's files are moved, once every
    partition is written, to `<checkpoint>/arrowstate-exported-<v>/`. Running it again does
    nothing."""
    def check(conf, last, chosen, operators):
        provider = conf.get(PROVIDER_SETTING, HDFS_PROVIDER)
        if provider not in (HDFS_PROVIDER, ROCKSDB_PROVIDER):
            raise CheckpointError(
                f"{checkpoint}: the query's state store provider is {provider} "
                f"(offsets/{last}); export writes the formats of {HDFS_PROVIDER} and "
                f"{ROCKSDB_PROVIDER} only")
        if conf.get("spark.sql.streaming.stateStore.rowChecksum.enabled") == "true":
            raise CheckpointError(f"{checkpoint}: the query stores row checksums "
                                  "(spark.sql.streaming.stateStore.rowChecksum.enabled=true); "
                                  "export does not write them")
        tws = [o for o in chosen if _is_tws(o)]
        encoding = conf.get("spark.sql.streaming.stateStore.encodingFormat", "unsaferow")
        if tws and encoding != "unsaferow":
            raise CheckpointError(
                f"{checkpoint}: operator {tws[0]['operator_id']} ({tws[0]['name']}) records "
                f"the state encoding {encoding} (spark.sql.streaming.stateStore."
                f"encodingFormat, offsets/{last}); export writes transformWithState state as "
                "unsaferow only; nothing was changed")
        if provider == ROCKSDB_PROVIDER or not tws:
            return {}
        # Spark runs transformWithState on RocksDB only: arrowstate ran it on the recorded
        # HDFS-backed provider, so every operator's state is written for RocksDB and the
        # offset log records it, which needs all the query's state to be arrowstate's
        theirs = [o for o in operators if o["engine"] != "none" and o not in chosen]
        if theirs:
            raise CheckpointError(
                f"{checkpoint}: operator {theirs[0]['operator_id']} ({theirs[0]['name']}) "
                f"holds {theirs[0]['engine']} state of {HDFS_PROVIDER}; Spark runs "
                f"transformWithState on {ROCKSDB_PROVIDER} only, and export moves only "
                "arrowstate's state to it; nothing was changed")
        return {PROVIDER_SETTING: ROCKSDB_PROVIDER}

    def call(conversion, spark, state_root, o, key, value, version, conf):
        if _is_tws(o):
            return tws_state.export_operator(spark, checkpoint, state_root, o["operator_id"],
                                             version - 1, version, o["partitions"])
        return conversion.convertOperator("export", spark._jsparkSession, state_root,
                                          o["operator_id"], o["partitions"], version, key,
                                          value, conf.get(PROVIDER_SETTING, HDFS_PROVIDER),
                                          "UTC")   # export writes Spark's rows: no zone

    return _convert(checkpoint, "exported",
                    lambda o: ARROWSTATE in o["engine"].split("+"), check, _store_settings, call,
                    "arrowstate-exported", lambda name: store_files.parse_name(name) is not None)


def import_from_spark(checkpoint: str, time_zone: str | None = None) -> dict:
    """Converts the state Spark's own store holds (through the provider the checkpoint
    records: HDFS-backed or RocksDB) for the operators arrowstate runs to arrowstate's
    format (the newest committed version, as one snapshot per partition), so that the
    query continues on arrowstate. Spark's files are moved, once every snapshot is written,
    to `<checkpoint>/spark-state-imported-<v>/`. Timestamps in the state take `time_zone`
    (the session time zone the query runs with; this machine's by default). Running it
    again does nothing."""
    def choose(o):
        if o["engine"] == "none" or ARROWSTATE in o["engine"].split("+"):
            return False
        if o["family"] is None:
            raise CheckpointError(
                f"{checkpoint}: operator {o['operator_id']} ({o['name']}) is not one "
                "arrowstate runs; its state stays Spark's (nothing was converted)")
        return True

    def call(conversion, spark, state_root, o, key, value, version, conf):
        zone = time_zone or spark.conf.get("spark.sql.session.timeZone")
        if _is_tws(o):
            return tws_state.convert_operator(spark, checkpoint, o["operator_id"], version - 1,
                                              version, o["partitions"], zone, repartition=False)
        provider = conf.get(PROVIDER_SETTING, HDFS_PROVIDER)
        return conversion.convertOperator("import", spark._jsparkSession, state_root,
                                          o["operator_id"], o["partitions"], version, key,
                                          value, provider, zone)

    return _convert(checkpoint, "imported", choose, lambda conf, last, chosen, ops: {},
                    _store_settings, call,
                    "spark-state-imported",
                    # RocksDB's SST files too: left behind, they read as Spark's state
                    lambda name: name == "SSTs" or bool(store_files.spark_store_files([name])))


def state_command(command: str, checkpoint: str, partitions: int | None = None,
                  time_zone: str | None = None) -> dict:
    """What `python -m arrowstate state <command>` prints as JSON (describe's --json)."""
    return {"describe": lambda: describe(checkpoint),
            "export": lambda: export_to_spark(checkpoint),
            "import": lambda: import_from_spark(checkpoint, time_zone),
            "repartition": lambda: repartition(checkpoint, partitions, time_zone)}[command]()


def _write_log_entry(path: str, text: str) -> None:
    """A new offsets/ or commits/ entry, written whole or not at all."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.arrowstate-tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _offsets_with_conf(checkpoint: str, batch: int, changes: dict) -> str:
    """offsets/`batch`'s text with `changes` made to the settings it records."""
    with open(os.path.join(checkpoint, "offsets", str(batch))) as f:
        lines = f.read().split("\n")
    meta = json.loads(lines[1])
    meta["conf"].update(changes)
    lines[1] = json.dumps(meta, separators=(",", ":"))
    return "\n".join(lines)


def _planned_batch(checkpoint: str) -> int | None:
    offsets = os.path.join(checkpoint, "offsets")
    return max((int(n) for n in os.listdir(offsets) if n.isdigit()), default=None)


def repartition(checkpoint: str, partitions: int, time_zone: str | None = None) -> dict:
    """Offline repartition of arrowstate state, as Spark 4.3's repartition does it for
    RocksDB: batch L+1 (after the last committed L) is recorded as a batch that reads no
    input, with `partitions` shuffle partitions, and every operator's state becomes, at its
    version L+2, the same rows hash-partitioned anew by their keys. The query then continues
    from L+2 with `partitions` partitions.

    The order keeps a failure safe: offsets/L+1 first (until its commit exists Spark
    refuses to restart the query: an unfinished repartition), then the snapshots, then
    commits/L+1. After a failure, run the command again: it finishes the same batch."""
    described = describe(checkpoint)
    last = described["lastCommittedBatch"]
    stateful = [o for o in described["operators"] if o["engine"] != "none"]
    theirs = [o for o in stateful if o["engine"] != ARROWSTATE]
    if theirs:
        raise CheckpointError(
            f"{checkpoint}: operator {theirs[0]['operator_id']} holds {theirs[0]['engine']} "
            "state; this command repartitions checkpoints whose state is all arrowstate's "
            "(Spark's own repartition handles RocksDB state)")
    if not stateful or last is None:
        raise CheckpointError(f"{checkpoint}: no committed arrowstate state to repartition")
    if partitions < 1:
        raise CheckpointError(f"the number of partitions must be positive, not {partitions}")
    for o in stateful:
        if o["stores"] != ["default"]:
            raise CheckpointError(f"{checkpoint}: operator {o['operator_id']} has state stores "
                                  f"{o['stores']}; only the default store is repartitioned")
        _refuse_column_families(checkpoint, o, last)
    key = "spark.sql.shuffle.partitions"
    current = int(offset_conf(checkpoint, last).get(key, "0"))
    planned = _planned_batch(checkpoint)
    if planned == last + 1 and int(offset_conf(checkpoint, planned).get(key, "0")) == partitions \
            and current != partitions:
        pass   # an unfinished run of this command: finish it
    else:
        _refuse_running(checkpoint, last)
        if current == partitions:
            return {"checkpoint": described["checkpoint"], "repartitioned": [],
                    "message": f"the state already has {partitions} partitions: nothing to do"}
        _write_log_entry(os.path.join(checkpoint, "offsets", str(last + 1)),
                         _offsets_with_conf(checkpoint, last, {key: str(partitions)}))
    version = last + 2
    state_root = os.path.abspath(os.path.join(checkpoint, "state"))
    done = []
    with _conversion_session("arrowstate state repartition", {}) as spark:
        zone = time_zone or spark.conf.get("spark.sql.session.timeZone")
        conversion = spark._jvm.org.apache.spark.sql.arrowstate.StateConversion
        for o in stateful:
            if _is_tws(o):
                counts = tws_state.convert_operator(spark, checkpoint, o["operator_id"], last,
                                                    version, partitions, zone, repartition=True)
                done.append({"operator_id": o["operator_id"], "version": version,
                             "rows": counts})
                continue
            schemas = read_schema_file(
                os.path.join(state_root, str(o["operator_id"]), "0", "_metadata", "schema"))
            rows = (spark.read.format("statestore").option("batchId", last)
                    .option("operatorId", o["operator_id"]).load(checkpoint))
            counts = conversion.repartitionOperator(
                spark._jsparkSession, rows._jdf, state_root, o["operator_id"], partitions,
                version, json.dumps(schemas[0]), json.dumps(schemas[1]), zone)
            done.append({"operator_id": o["operator_id"], "version": version,
                         "rows": list(counts)})
    with open(os.path.join(checkpoint, "commits", str(last))) as f:
        commit = f.read()
    _write_log_entry(os.path.join(checkpoint, "commits", str(last + 1)), commit)
    return {"checkpoint": described["checkpoint"], "repartitioned": done,
            "message": f"batch {last + 1} repartitions the state from {current} to "
                       f"{partitions} partitions"}
