"""arrowstate state as Spark's state stores present it: key and value rows in the schemas
Spark records for the operator (its `_metadata/schema` files), so that Spark's own readers
(`spark.read.format("statestore")`) show arrowstate state as they show native state.

Our files hold the key columns `k0..` then the value columns `v0..` of each family:
- deduplication: no value (Spark's value is one null `__dummy__` field); within the
  watermark: `expiresAtMicros`;
- aggregation: the aggregation buffer, field for field, as Spark's value;
- applyInPandasWithState: the state fields, whether a value is defined, and the timeout
  timestamp; Spark's value is the `groupState` struct (null when undefined) and, when the
  operator has timeouts, `timeoutTimestamp`.
"""
from __future__ import annotations

import json
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from .store import VersionedState
from .store import files as store_files
from .store.lifecycle import FileSource, load_plans

DUMMY = "__dummy__"
GROUP_STATE, TIMEOUT = "groupState", "timeoutTimestamp"
BATCH_ROWS = 1 << 16


def _value_layout(value_schema: dict) -> str:
    names = [f["name"] for f in value_schema["fields"]]
    if names == [DUMMY]:
        return "dummy"
    if names and names[0] == GROUP_STATE and isinstance(value_schema["fields"][0]["type"], dict):
        return "groupState"
    return "fields"


def spark_rows(batch: pa.RecordBatch, key_schema: dict, value_schema: dict
               ) -> pa.RecordBatch:
    """Stored rows as two struct columns, `key` and `value`, in Spark's schemas."""
    key_count = len(key_schema["fields"])
    key_names = [f["name"] for f in key_schema["fields"]]
    values = batch.columns[key_count:]
    n = batch.num_rows
    layout = _value_layout(value_schema)
    value_names = [f["name"] for f in value_schema["fields"]]
    if layout == "dummy":
        value = pa.StructArray.from_arrays([pa.nulls(n, pa.null())], names=[DUMMY])
    elif layout == "groupState":
        state_names = [f["name"] for f in value_schema["fields"][0]["type"]["fields"]]
        width = len(state_names)
        defined = values[width]
        group = pa.StructArray.from_arrays(values[:width], names=state_names,
                                           mask=pc.invert(defined))
        columns, names = [group], [GROUP_STATE]
        if TIMEOUT in value_names:
            columns.append(values[width + 1])
            names.append(TIMEOUT)
        value = pa.StructArray.from_arrays(columns, names=names)
    else:
        if len(values) != len(value_names):
            raise ValueError(f"arrowstate holds {len(values)} value columns, but Spark's "
                             f"value schema has {len(value_names)} ({value_names})")
        value = pa.StructArray.from_arrays(values, names=value_names)
    key = pa.StructArray.from_arrays(batch.columns[:key_count], names=key_names)
    return pa.RecordBatch.from_arrays([key, value], names=["key", "value"])


def stored_schema(source: FileSource, version: int) -> pa.Schema | None:
    """The state columns of the files that load `version` (None at version 0)."""
    if version == 0:
        return None
    plans, _ = load_plans(source.names(), version, source.where, source.context)
    chain = plans[0][0]
    payload = source.read(chain[0])
    if store_files.unique_id(payload) is not None:
        payload = payload[:-store_files.TRAILER.size]
    try:
        schema = pa.ipc.open_stream(pa.py_buffer(payload)).schema
    except pa.ArrowException as e:
        raise store_files.CorruptStateFile(f"{source.where}/{chain[0]}", source.context,
                                           f"its Arrow data is invalid: {e}") from e
    return pa.schema(list(schema)[:-1])


def read_state(source: FileSource, version: int, key_schema_json: str,
               value_schema_json: str) -> Iterator[pa.RecordBatch]:
    """Every live row of `version`, in Spark's key and value layout, verified as a task's
    load verifies it."""
    key_schema, value_schema = json.loads(key_schema_json), json.loads(value_schema_json)
    schema = stored_schema(source, version)
    if schema is None:
        return
    key_count = len(key_schema["fields"])
    state = VersionedState(list(schema)[:key_count], list(schema)[key_count:])
    state.load(source, version)
    for batch in state.rows.frozen().batches(BATCH_ROWS):
        yield spark_rows(batch, key_schema, value_schema)
