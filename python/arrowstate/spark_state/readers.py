"""arrowstate state as Spark's state stores present it: key and value rows in the schemas
Spark records for the operator (its `_metadata/schema` files), so that Spark's own readers
(`spark.read.format("statestore")`) show arrowstate state as they show native state. The
rows are laid out by the family's layout object (layouts); the requests read here
carry Spark's schemas only, so the layout is the one those schemas are
(`layouts.layout_of_schema`).
"""
from __future__ import annotations

import json
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from ..store.formats import container, decoding, evolution, manifest, names as file_names
from ..store.lineage import lineage_deltas, lineage_plans
from ..store.formats import files as store_files
from ..store.lifecycle.chains import load_plans
from ..store.lifecycle.sources import FileSource, columns_reader
from ..store.versions.versioned import VersionedState
from .layouts import layout_of_schema
from .transform_with_state import (FEED_DELETE, FEED_MERGE, FEED_PUT,  # noqa: F401
                                   TIMER_FAMILIES, TIMER_VARIABLE, change_records)

BATCH_ROWS = 1 << 16


def spark_rows(batch: pa.RecordBatch, key_schema: dict, value_schema: dict
               ) -> pa.RecordBatch:
    """Stored rows as two struct columns, `key` and `value`, in Spark's schemas."""
    return layout_of_schema(value_schema).spark_rows(batch, key_schema, value_schema)


def stored_schema(source: FileSource, version: int, names: list[str] | None = None,
                  checkpoint_id: str | None = None) -> pa.Schema | None:
    """The state columns of the files that load `version` (None at version 0): the newest
    file's (a family that names its columns may have added some since the oldest).
    `names`: the directory's listing, where the caller has it; `checkpoint_id`: the
    version's under checkpoint format v2 (`store.lineage`)."""
    if version == 0:
        return None
    names = source.names() if names is None else names
    if checkpoint_id is None:
        plans, _ = load_plans(names, version, source.where, source.context)
        newest = plans[0][0][-1]
    else:
        newest = next(lineage_plans(source, names, version, checkpoint_id))[0][-1]
    payload = source.read(newest)
    made = (manifest.read(f"{source.where}/{newest}", source.context, payload)
            if newest.endswith(file_names.SUFFIX[file_names.SNAPSHOT]) else None)
    if made is not None:   # a snapshot naming run files: their columns (empty: none)
        pieces = [p for run in made.runs for p in run]
        if not pieces:
            return None
        newest, payload = pieces[-1].name, source.read(pieces[-1].name)
    return decoding.stored_columns(f"{source.where}/{newest}", source.context,
                                   payload, columns_reader(source, names))


def stored_state(source: FileSource, version: int, fields_by_name: bool = False,
                 checkpoint_id: str | None = None) -> VersionedState | None:
    """An empty state in the columns of the files that load `version` (None at version 0):
    the key columns (`k0..`), then the value columns (`v0..`), by name when the files name
    them; older files of a transformWithState variable whose schema evolved read in the
    newest one's, fields by name with `fields_by_name` (Spark's Avro state encoding)."""
    schema = stored_schema(source, version, checkpoint_id=checkpoint_id)
    if schema is None:
        return None
    fields = list(schema)
    names = [(f.metadata or {}).get(store_files.COLUMN_NAME) for f in fields]
    if any(names):
        key_count = names.index(next(n for n in names if n))
        values = [pa.field(n.decode(), f.type) for n, f in zip(names[key_count:],
                                                               fields[key_count:])]
        return VersionedState(
            fields[:key_count], values, named_columns=True,
            evolve=lambda _name, column, to: evolution.variable_evolved(column, to,
                                                                        fields_by_name))
    key_count = sum(1 for f in fields if f.name.startswith("k"))
    return VersionedState(fields[:key_count], fields[key_count:])


def read_state(source: FileSource, version: int, key_schema_json: str,
               value_schema_json: str, snapshot: int | None = None,
               checkpoint_id: str | None = None) -> Iterator[pa.RecordBatch]:
    """Every live row of `version`, in Spark's key and value layout, verified as a task's
    load verifies it; with `snapshot`, loaded from that snapshot and the deltas after it;
    with `checkpoint_id` (format v2), from that attempt's lineage."""
    key_schema, value_schema = json.loads(key_schema_json), json.loads(value_schema_json)
    state = stored_state(source, version, checkpoint_id=checkpoint_id)
    if state is None:
        return
    state.load(source, version, snapshot, checkpoint_id)
    for batch in state.rows.frozen().batches(BATCH_ROWS):
        yield spark_rows(batch, key_schema, value_schema)


def read_changes(source: FileSource, start: int, end: int, key_schema_json: str,
                 value_schema_json: str, checkpoint_id: str | None = None
                 ) -> Iterator[pa.RecordBatch]:
    """The puts and removes of versions start..end, in order, as Spark's change data readers
    give them: `key`, `value` (null for a remove), `op` (1 put, 0 remove), `version`;
    `checkpoint_id`: `end`'s under format v2 (the deltas of its lineage)."""
    key_schema, value_schema = json.loads(key_schema_json), json.loads(value_schema_json)
    names = source.names()
    schema = stored_schema(source, end, names, checkpoint_id)
    if schema is None:
        return
    read_columns = columns_reader(source, names)
    deltas = lineage_deltas(source, names, end, checkpoint_id, start)
    for version in range(start, end + 1):
        name = deltas.get(version, file_names.file_name(file_names.DELTA, version))
        if name not in names:
            raise _missing_delta(source, name, start)
        batches, _ = decoding.decode(f"{source.where}/{name}", source.context,
                                     source.read(name), schema, read_columns=read_columns)
        for batch in batches:
            for op, run in store_files.op_runs(batch):
                if op not in (store_files.OP_PUT, store_files.OP_REMOVE):
                    continue
                rows = spark_rows(pa.RecordBatch.from_arrays(run.columns[:-1],
                                                             schema=schema),
                                  key_schema, value_schema)
                value = rows.column(1)
                if op == store_files.OP_REMOVE:
                    value = pa.nulls(len(value), value.type)
                yield pa.RecordBatch.from_arrays(
                    [rows.column(0), value, pa.array([op] * len(value), pa.int8()),
                     pa.array([version] * len(value), pa.int64())],
                    names=["key", "value", "op", "version"])


def _missing_delta(source: FileSource, name: str, start: int) -> Exception:
    return container.CorruptStateFile(
        f"{source.where}/{name}", source.context,
        f"the change feed from version {start} needs it, and it does not exist (retention "
        f"removed it, or the state never reached that version)",
        condition="CANNOT_LOAD_STATE_STORE.CANNOT_READ_DELTA_FILE_NOT_EXISTS")


# transformWithState: Spark keeps each state variable in a column family of its own
# (transform_with_state.py lays its rows out)


def _variable_column(source: FileSource, state: VersionedState, column_family: str
                     ) -> tuple[int, int, str]:
    """The state's key column count, and the column and name of the column family's
    variable."""
    key_count, fields = state.key_count, list(state.schema)
    named = [(f.metadata or {}).get(store_files.COLUMN_NAME, b"").decode()
             for f in fields[key_count:]]
    if not all(named):
        raise ValueError(f"arrowstate: {source.where} ({source.context}) holds no "
                         f"transformWithState state: it has no column family {column_family}")
    variable = TIMER_VARIABLE if column_family in TIMER_FAMILIES else column_family
    if f"s_{variable}" not in named:
        raise ValueError(f"arrowstate: the transformWithState state in {source.where} "
                         f"({source.context}) has no state variable {variable!r}; it has "
                         f"{sorted(n[2:] for n in named)}")
    return key_count, key_count + named.index(f"s_{variable}"), variable


def read_column_family(source: FileSource, version: int, column_family: str,
                       key_schema_json: str, value_schema_json: str,
                       snapshot: int | None = None, fields_by_name: bool = False,
                       checkpoint_id: str | None = None) -> Iterator[pa.RecordBatch]:
    """A transformWithState variable of `version` as Spark's column family of it holds it:
    one row per value (value state), per list element (rows of a key one after another),
    per map entry (key `struct<key, userKey>`) or per timer (key `struct<key,
    expiryTimestampMs>`, for the timer column families)."""
    key_schema, value_schema = json.loads(key_schema_json), json.loads(value_schema_json)
    state = stored_state(source, version, fields_by_name, checkpoint_id)
    if state is None:
        return
    _variable_column(source, state, column_family)   # fails naming the files
    layout = layout_of_schema(value_schema, column_family)
    state.load(source, version, snapshot, checkpoint_id)
    for batch in state.rows.frozen().batches(BATCH_ROWS):
        rows = layout.spark_rows(pa.RecordBatch.from_arrays(batch.columns, schema=state.schema),
                                 key_schema, value_schema, column_family)
        if rows.num_rows:
            yield rows


def read_column_family_changes(source: FileSource, start: int, end: int,
                               column_family: str, key_schema_json: str,
                               value_schema_json: str, fields_by_name: bool = False,
                               checkpoint_id: str | None = None) -> Iterator[pa.RecordBatch]:
    """Spark's change feed of a transformWithState variable over versions start..end: a
    record per state operation, from the change records of each delta (store.formats.files); a key
    whose put or remove row has none changed by that one write (a value or list put, a
    remove a delete; deltas before change records: a map's put row its entries' updates).
    Columns `key`, `value` (null for a delete) in the family's schemas, `op` (FEED_*) and
    `version`."""
    if column_family in TIMER_FAMILIES:
        raise ValueError(f"arrowstate: the change feed of timers ({source.where}, "
                         f"{source.context}) is not readable; read registered timers at "
                         f"each batchId instead")
    key_schema, value_schema = json.loads(key_schema_json), json.loads(value_schema_json)
    state = stored_state(source, end, fields_by_name, checkpoint_id)
    if state is None:
        return
    key_count, column, variable = _variable_column(source, state, column_family)
    names = source.names()
    read_columns = columns_reader(source, names)
    value_names = [f["name"] for f in value_schema["fields"]]
    deltas = lineage_deltas(source, names, end, checkpoint_id, start)
    for version in range(start, end + 1):
        name = deltas.get(version, file_names.file_name(file_names.DELTA, version))
        if name not in names:
            raise _missing_delta(source, name, start)
        batches, _ = decoding.decode(f"{source.where}/{name}", source.context,
                                     source.read(name), state.schema,
                                     state.dropped_columns, state.evolve, read_columns)
        # a key's change records and its rows are in batches of their own
        mine = [b.filter(pc.equal(b.column(key_count - 1), variable)) for b in batches]
        mine = [b for b in mine if b.num_rows]
        if mine:
            yield change_records(pa.concat_batches(mine), key_count - 1, column, key_schema,
                                 value_names, version)

