"""`python -m arrowstate state describe`: a streaming checkpoint's state, read offline (no
Spark for a checkpoint on the local disk): per stateful operator, its family and what its
state holds, partitions, newest version, rows, bytes on disk, key and value schemas and the
engine whose files hold it; for transformWithState each state variable (kind, schema, TTL)
and the timers.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

from .. import contract
from ..store.formats import names as file_names
from .checkpoint_files import (ARROWSTATE, CheckpointError, PartitionFiles,
                               last_committed_batch, offset_conf, operator_metadata,
                               partition_engine, read_state_schema_file,
                               committed_checkpoint_ids)
from .filesystems import files_for
from .layouts import LAYOUTS
from .readers import stored_state
from .transform_with_state import describe_variables

# Spark's operator names (operator metadata) and the arrowstate family that runs them
FAMILIES = {name: family for family, declared in contract.FAMILIES.items()
            for name in declared["sparkMetadataNames"]}


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
    holds: str | None = None               # what the family's state holds, in a sentence
    state_variables: list[dict] | None = None   # transformWithState's
    timers: dict | None = None             # transformWithState's, unless NoTime


def _simple(schema: dict) -> str:
    from pyspark.sql.types import StructType
    return StructType.fromJson(schema).simpleString()


def describe(checkpoint: str) -> dict:
    """What the checkpoint's state is, per operator (see the module's docstring)."""
    files = files_for(checkpoint)
    state_root = os.path.join(checkpoint, "state")
    require_checkpoint(checkpoint)
    last = last_committed_batch(checkpoint)
    operators = []
    op_ids = sorted(int(n) for n in files.listdir(state_root) if n.isdigit()) \
        if files.isdir(state_root) else []
    for op in op_ids:
        operators.append(_describe_operator(checkpoint, op, last, _partitions(checkpoint,
                                                                             last)))
    return {"checkpoint": files.absolute(checkpoint), "lastCommittedBatch": last,
            "operators": [asdict(o) for o in operators]}


def require_checkpoint(checkpoint: str) -> None:
    """A CheckpointError unless `checkpoint` is a streaming checkpoint's directory."""
    files = files_for(checkpoint)
    if not files.isdir(checkpoint):
        raise CheckpointError(f"{checkpoint}: no such directory")
    if not files.isdir(os.path.join(checkpoint, "offsets")):
        raise CheckpointError(f"{checkpoint}: not a streaming checkpoint (no offsets/)")


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
    files = files_for(checkpoint)
    op_dir = os.path.join(checkpoint, "state", str(op))
    name, stores, declared = "unknown", ["default"], None
    info = operator_metadata(op_dir)
    if info is not None:
        name = info["operatorInfo"]["operatorName"]
        stores = [s["storeName"] for s in info["stateStoreInfo"]]
        declared = max((s["numPartitions"] for s in info["stateStoreInfo"]), default=None)
    parts = sorted(int(n) for n in files.listdir(op_dir) if n.isdigit())
    if active is not None:   # directories beyond are left from an earlier partitioning
        parts = [p for p in parts if p < active]
        declared = active
    engines, newest = set(), 0
    for p in parts:
        engine, version = partition_engine(files.listdir(os.path.join(op_dir, str(p))))
        if engine:
            engines.add(engine)
        newest = max(newest, version)
    engine = "+".join(sorted(engines)) or "none"
    key_schema = value_schema = None
    schema_path = os.path.join(op_dir, "0", "_metadata", "schema")
    if files.exists(schema_path):
        key, value = read_state_schema_file(schema_path)
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
        ids = committed_checkpoint_ids(checkpoint, op).get(version, [])
        rows = sum(_arrowstate_rows(os.path.join(op_dir, str(p)), op, p, version,
                                    ids[p] if p < len(ids) else None)
                   for p in parts)
    elif engine not in ("none", ARROWSTATE):
        note = ("rows are counted for arrowstate state only; for Spark's own state, "
                "spark.read.format('statestore') counts them")
    family = FAMILIES.get(name)
    variables = timers = None
    if family is not None and LAYOUTS[family].column_families and info is not None:
        variables, timers = describe_variables(op_dir, info)
    return Operator(op, name, family, engine, declared or len(parts), newest, rows,
                    files.tree_size(op_dir), key_schema, value_schema, stores, note,
                    None if family is None else LAYOUTS[family].holds, variables, timers)


def _arrowstate_rows(where: str, op: int, partition: int, version: int,
                     checkpoint_id: str | None = None) -> int:
    source = PartitionFiles(where, f"operator {op}, partition {partition}, version {version}")
    if not any(file_names.parse_name(n) for n in source.names()):
        return 0
    state = stored_state(source, version, checkpoint_id=checkpoint_id)
    state.load(source, version, checkpoint_id=checkpoint_id)
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
                  f"{o['newest_version']} | rows: {rows} | bytes on disk: {o['bytes_on_disk']}"]
        if o["holds"]:
            lines.append(f"  holds: {o['holds']}")
        if o["state_variables"] is None:
            lines += [f"  key:   {o['key_schema']}", f"  value: {o['value_schema']}"]
        else:
            lines.append("  state variables:" if o["state_variables"] else
                         "  state variables: none")
            for v in o["state_variables"]:
                key = f"key {v['key_schema']} -> " if v["kind"] == "map" else ""
                ttl = ", with a TTL" if v["ttl"] else ""
                lines.append(f"    {v['name']}: {v['kind']} of {key}{v['schema']}{ttl}")
            timers = o["timers"]
            lines.append("  timers: none (NoTime)" if timers is None else
                         f"  timers: {timers['time_mode']}: {timers['schema']}")
        if o["note"]:
            lines.append(f"  note: {o['note']}")
    return "\n".join(lines)
