"""Spark's state as arrowstate state (IMPORT_STATE, for `python -m arrowstate state import`,
`repartition` and an operator's adoption of Spark's state): rows of a native state store, in
Spark's key and value schemas, become the family's stored columns (its layout object's
`our_rows`; the request carries Spark's schemas only, so the layout is the one they are:
`layouts.layout_of_schema`) and one snapshot file of the version."""
from __future__ import annotations

import json
from typing import Iterable

import pyarrow as pa

from ..store.formats import encoding, names as file_names
from ..store.formats import files as store_files
from .layouts import layout_of_schema


def our_rows(batch: pa.RecordBatch, value_schema: dict) -> pa.RecordBatch:
    """Spark's `key` and `value` struct columns as arrowstate's `k0..` and `v0..` columns."""
    return layout_of_schema(value_schema).our_rows(batch, value_schema)


def snapshot(version: int, value_schema_json: str, batches: Iterable[pa.RecordBatch],
             empty_schema: pa.Schema, checkpoint_id: str | None = None) -> bytes:
    """One arrowstate snapshot of `version` holding every row of `batches`; `empty_schema`
    (Spark's key and value columns) gives the columns when no row comes. `checkpoint_id`
    (checkpoint format v2): the id the commit log names for the version, the snapshot's
    unique id (its file is named with it: `names.file_name`)."""
    value_schema = json.loads(value_schema_json)
    rows = [our_rows(b, value_schema) for b in batches]
    if not rows:
        empty = pa.RecordBatch.from_pylist([], schema=empty_schema)
        rows = [our_rows(empty, value_schema)]
    schema = rows[0].schema
    data, _ = encoding.encode(schema, file_names.SNAPSHOT, version,
                              (store_files.with_op(r, store_files.OP_PUT) for r in rows),
                              uid=file_names.checkpoint_uid(checkpoint_id))
    return data

