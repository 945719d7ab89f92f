"""Spark's state as arrowstate state (`python -m arrowstate state import`): rows of a native
state store, in Spark's key and value schemas, become arrowstate's columns of the family
(the inverse of `state_data.spark_rows`) and one snapshot file of the version."""
from __future__ import annotations

import json
from typing import Iterable

import numpy as np
import pyarrow as pa

from .state_data import TIMEOUT, value_layout
from .store import files as store_files

NO_TIMESTAMP = -1


def our_rows(batch: pa.RecordBatch, value_schema: dict) -> pa.RecordBatch:
    """Spark's `key` and `value` struct columns as arrowstate's `k0..` and `v0..` columns."""
    keys = batch.column(0).flatten()
    value = batch.column(1)
    layout = value_layout(value_schema)
    names = [f["name"] for f in value_schema["fields"]]
    if layout == "dummy":
        values = []
    elif layout == "groupState":
        group = value.field(0)
        defined = group.is_valid()
        values = list(group.flatten()) + [defined]
        values.append(value.field(names.index(TIMEOUT)) if TIMEOUT in names
                      else pa.array(np.full(len(batch), NO_TIMESTAMP, dtype=np.int64)))
    else:
        values = list(value.flatten())
    columns = list(keys) + values
    names = ([f"k{i}" for i in range(len(keys))] +
             [f"v{i}" for i in range(len(values))])
    return pa.RecordBatch.from_arrays(columns, names=names)


def snapshot(version: int, value_schema_json: str, batches: Iterable[pa.RecordBatch],
             empty_schema: pa.Schema) -> bytes:
    """One arrowstate snapshot of `version` holding every row of `batches`; `empty_schema`
    (Spark's key and value columns) gives the columns when no row comes."""
    value_schema = json.loads(value_schema_json)
    rows = [our_rows(b, value_schema) for b in batches]
    if not rows:
        empty = pa.RecordBatch.from_pylist([], schema=empty_schema)
        rows = [our_rows(empty, value_schema)]
    schema = rows[0].schema
    data, _ = store_files.encode(schema, store_files.SNAPSHOT, version,
                                 (store_files.with_op(r, store_files.OP_PUT) for r in rows))
    return data

