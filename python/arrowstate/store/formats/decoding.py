"""Reading a state file (the layout is in `files`): nothing in it is used before all of it
is verified (trailer, length, checksum, then every record batch in full), and named columns
written in an older schema are read in the query's (`evolution`). Also what a file records
without reading its rows: its state figures, its columns."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc

from ...errors import ArrowStateError
from . import compact, evolution
from .compact import FLAG_CHANGES
from .container import (FLAG_BASE, FORMAT_2, FORMAT_COMPACT, FORMAT_MANIFEST,
                        FORMAT_VERSION, FORMAT_WITH_CHANGES, CorruptStateFile,
                        checked_trailer)
from .files import (CHANGE_DELETE, COLUMN_NAME, FIGURES, FORMAT, KIND_CODE, OP_COLUMN,
                    OP_PUT, OP_REMOVE)
from .names import DELTA, SNAPSHOT, id_mismatch, name_kind


class StateColumnsChanged(ArrowStateError):
    """Intact files whose columns this query cannot take: not damage (no older snapshot is
    tried instead); the message says what changed."""

    def __init__(self, path: str, context: str, what: str) -> None:
        super().__init__("STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION",
                         f"arrowstate cannot load state file {path} ({context}) into this "
                         f"query: {what}", path=path, context=context, reason=what)


def _column_names(fields: list) -> list:
    return [(f.metadata or {}).get(COLUMN_NAME) for f in fields]


def _by_name(path: str, context: str, stored: pa.Schema, wanted: pa.Schema,
             dropped: frozenset = frozenset(), evolve=evolution.positional) -> list:
    """For each wanted column, the stored column index that holds it, or its type (a column
    added since: null), or (index, type, evolve) for a column whose schema evolved since
    (`evolve(name, column, type)` reads it in the new type, or raises ValueError for a
    change Spark does not allow); empty when the columns are not named. Keys must be as
    they were; none may be left over but the `dropped` ones."""
    stored_fields, wanted_fields = list(stored)[:-1], list(wanted)
    key_count = _column_names(wanted_fields).count(None)
    stored_names = _column_names(stored_fields[key_count:])
    if (key_count == len(wanted_fields) or None in stored_names
            or None in _column_names(wanted_fields[key_count:])):
        return []
    if [f.type for f in stored_fields[:key_count]] != [f.type for f in wanted_fields[:key_count]]:
        raise StateColumnsChanged(path, context, "its key columns differ from this query's")
    where = {n: key_count + i for i, n in enumerate(stored_names)}
    plan: list = list(range(key_count))
    for f in wanted_fields[key_count:]:
        name = f.metadata[COLUMN_NAME]
        at = where.pop(name, None)
        if at is not None and stored_fields[at].type != f.type:
            try:
                evolve(name, pa.array([], stored_fields[at].type), f.type)
            except ValueError:
                raise StateColumnsChanged(path, context, f"column {name.decode()} is "
                                          f"{stored_fields[at].type} in the files but "
                                          f"{f.type} in this query") from None
            at = (at, f.type, lambda column, to, name=name: evolve(name, column, to))
        plan.append(f.type if at is None else at)
    left_over = set(where) - dropped
    if left_over:
        raise StateColumnsChanged(path, context, "the files hold columns this query does not "
                                  f"declare: {sorted(n.decode() for n in left_over)}")
    return plan


def _project(batch: pa.RecordBatch, plan: list) -> pa.RecordBatch:
    columns = [batch.column(p) if isinstance(p, int)
               else p[2](batch.column(p[0]), p[1]) if isinstance(p, tuple)
               else pa.nulls(batch.num_rows, p)
               for p in plan] + [batch.column(batch.num_columns - 1)]
    return pa.RecordBatch.from_arrays(columns, names=[f"c{i}" for i in range(len(columns))])


def recorded_figures(path: str, payload: bytes) -> dict | None:
    """The state figures a delta records (None when it records none: a file of an older
    arrowstate, or a snapshot), after checking its trailer and checksum; its rows are not
    decoded. Damage is a CorruptStateFile naming `path`."""
    def bad(what: str) -> CorruptStateFile:
        return CorruptStateFile(path, "state history", what)

    fields = checked_trailer(payload, bad)
    if fields is None:
        return None   # format 1: no figures
    length = fields[7]
    if fields[1] == FORMAT_COMPACT:
        return compact.head(memoryview(payload)[:length], bad)[2]
    try:   # the stream's schema message only: no record batch is read
        meta = pa.ipc.open_stream(pa.py_buffer(memoryview(payload)[:length])).schema.metadata
        recorded = (meta or {}).get(FIGURES)
        return None if recorded is None else json.loads(recorded)
    except (pa.ArrowException, ValueError) as e:
        raise bad(f"its Arrow schema or figures cannot be read: {e}") from e


def _stream(path: str, context: str, payload, read_columns, bad) -> tuple:
    """A file's Arrow IPC stream, its trailer's fields (None for format 1) and the highest
    op its rows may hold; every check of the trailer done."""
    version, kind = name_kind(path.rsplit("/", 1)[-1])
    fields = checked_trailer(payload, bad)
    if fields is None:
        return memoryview(payload), None, OP_PUT
    (_, fmt, kind_code, flags, _, file_version, rows, length, uid, crc) = fields
    if fmt == FORMAT_MANIFEST and kind == SNAPSHOT:
        raise bad("it is a snapshot that names run files (format 5), read through "
                  "`manifest`, not as rows")
    if fmt not in (FORMAT_VERSION, FORMAT_WITH_CHANGES, FORMAT_COMPACT):
        raise bad(f"its trailer says state file format {fmt}; this arrowstate reads "
                  f"formats 1 to {FORMAT_MANIFEST} (damaged, or a newer arrowstate wrote it)")
    allowed_flags = ((FLAG_CHANGES if fmt == FORMAT_COMPACT else 0)
                     | (FLAG_BASE if kind == DELTA else 0))
    if (kind_code != KIND_CODE[kind] or (version is not None and file_version != version)
            or flags & ~allowed_flags or (fmt == FORMAT_COMPACT and kind != DELTA)):
        described = ("delta", "snapshot", "schema", "run")[kind_code % 4]
        raise bad(f"its trailer describes a {described} of version {file_version}, not "
                  f"this file's {kind}" + (f" of version {version}" if version else ""))
    mismatch = id_mismatch(path.rsplit("/", 1)[-1], uid)
    if mismatch is not None:
        raise bad(mismatch)
    changes = kind == DELTA and (fmt == FORMAT_WITH_CHANGES or flags & FLAG_CHANGES)
    highest_op = CHANGE_DELETE if changes else OP_PUT
    body = memoryview(payload)[:length]
    if fmt == FORMAT_COMPACT:
        body = compact.stream(path, context, body, read_columns, bad)
    return body, fields, highest_op


def decode(path: str, context: str, payload: bytes, schema: pa.Schema,
           dropped: frozenset = frozenset(), evolve=evolution.positional,
           read_columns=None) -> tuple[list[pa.RecordBatch], bytes | None]:
    """Every batch of one file (state columns plus the op column), all verified, and the
    file's unique id (None for format 1). Any damage is a CorruptStateFile naming `path`.
    Named columns written in an older schema are read in `schema`'s, by `evolve(name,
    column, type)` (`_by_name`). A compact delta's schema comes from `read_columns(name)`,
    the bytes of a columns file of its directory or None (`lifecycle.sources.columns_reader`)."""
    if name_kind(path.rsplit("/", 1)[-1]) is None:
        raise CorruptStateFile(path, context, "not an arrowstate state file name")

    def bad(what: str) -> CorruptStateFile:
        return CorruptStateFile(path, context, what)

    if len(payload) == 0:
        raise bad("the file is empty")
    body, fields, highest_op = _stream(path, context, payload, read_columns, bad)
    rows, uid = (None, None) if fields is None else (fields[6], fields[8])
    expected_format = FORMAT if fields is None else FORMAT_2
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(body))
        meta = reader.schema.metadata or {}
        if meta.get(b"format") != expected_format:
            if expected_format == FORMAT:
                raise bad("no arrowstate trailer and not a format 1 file either (truncated, "
                          "or not written by arrowstate)")
            raise bad(f"its payload is tagged {meta.get(b'format')!r}, not {FORMAT_2!r}")
        expected = [f.type for f in schema] + [pa.int8()]
        actual = [f.type for f in reader.schema]
        plan = None
        if actual != expected:   # named columns: the files may predate added columns
            plan = _by_name(path, context, reader.schema, schema, dropped, evolve)
            if not plan:
                raise bad(f"its columns {actual[:-1]} are not this operator's "
                          f"{expected[:-1]}")
        batches = []
        for batch in reader:
            _structural_view(batch).validate(full=True)
            batches.append(batch)
    except (CorruptStateFile, StateColumnsChanged):
        raise
    except (pa.ArrowException, ValueError, KeyError, OSError, IndexError) as e:
        if expected_format == FORMAT:
            raise bad("no arrowstate trailer, and not a readable format 1 file either "
                      f"(truncated, or not written by arrowstate): {e}") from e
        raise bad(f"its Arrow data is invalid: {e}") from e
    total = sum(b.num_rows for b in batches)
    if rows is not None and total != rows:
        raise bad(f"it holds {total} rows but its trailer says {rows}")
    for b in batches:
        ops = b.column(b.num_columns - 1)
        low, high = pc.min_max(ops).values()
        if ops.null_count or (len(ops) and (low.as_py() < OP_REMOVE
                                            or high.as_py() > highest_op)):
            raise bad(f"its {OP_COLUMN} column holds values other than {OP_REMOVE} to "
                      f"{highest_op}")
    if plan is not None:
        batches = [_project(b, plan) for b in batches]
    return batches, uid


def stored_columns(path: str, context: str, payload, read_columns=None) -> pa.Schema:
    """The state columns a file holds (its schema without the op column), its trailer and
    checksum checked; its rows are not decoded."""
    def bad(what: str) -> CorruptStateFile:
        return CorruptStateFile(path, context, what)

    body, _, _ = _stream(path, context, payload, read_columns, bad)
    try:
        schema = pa.ipc.open_stream(pa.py_buffer(body)).schema
    except pa.ArrowException as e:
        raise bad(f"its Arrow data is invalid: {e}") from e
    return pa.schema(list(schema)[:-1])


def _bytes_type(t: pa.DataType) -> pa.DataType:
    """The type with every string replaced by binary of the same memory form."""
    if pa.types.is_string(t):
        return pa.binary()
    if pa.types.is_large_string(t):
        return pa.large_binary()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_bytes_type(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(_bytes_type(t.key_type), _bytes_type(t.item_type))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_bytes_type(t.value_type)))
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_bytes_type(t.value_type)))
    return t


def _structural_view(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A zero-copy view in which strings are bytes: full validation then checks every
    offset and length (what a crash needs) but not UTF-8, since Spark's strings may hold
    any bytes (cast(binary as string)) and the checksum already vouches for the content."""
    columns = [c if _bytes_type(c.type) == c.type else c.view(_bytes_type(c.type))
               for c in batch.columns]
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)
