"""The state file format: its one home (names, encoding, decoding, verification; the
trailer in `container`, format 4's compact deltas in `compact`).

A partition's files live in `<checkpoint>/state/<operatorId>/<partitionId>/`:
`<version>.arrowstate.delta` (the puts and removes of one version, in order) and
`<version>.arrowstate.snapshot` (every live row of one version). Format 2, written since
arrowstate 0.2, and format 3, the same with change records in deltas:

    file    := payload trailer
    payload := an Arrow IPC stream: the key and value columns plus an `__op` column
               (1 put, 0 remove; in a format 3 delta also the change records 2 update,
               3 append, 4 delete); its schema metadata names the format, kind and version;
               its buffers are compressed with the codec Spark's state store setting names
               (LZ4 frame, Spark's default, or ZSTD; earlier arrowstate wrote them
               uncompressed: pyarrow reads each form)
    trailer := 60 bytes, little-endian: magic "ARWSTATE", format version (u16), kind (u8:
               0 delta, 1 snapshot), flags (u8, 0), reserved (u32, 0), state version (i64),
               row count (i64), payload length (i64), unique id (16 bytes), then CRC-32
               (zlib's) of the payload and every trailer byte before it (u32)

Format 4, written since arrowstate 0.5 for a small delta (its rows at most
COMPACT_MAX_BYTES), carries no schema: at 10 rows the schema was most of the file. The
partition keeps each schema once, in a schema file, that the delta names:

    schema file := `<id>.arrowstate.schema`: the schema's Arrow IPC message (metadata: the
                   format tag) and a trailer (format 4, kind 2, version 0, rows 0); its id,
                   32 hex digits, is the BLAKE2b-128 digest of that message
    compact delta := payload trailer (format 4, kind 0; flags bit 0: change records)
    payload := schema id (16 bytes), the length of the messages below (u32), the state
               figures (a count byte, 0 or 3, then each as an unsigned LEB128 number),
               then the Arrow IPC messages that follow the schema in its stream (record
               batches, uncompressed buffers, end of stream) as one ZSTD frame

The worker writes a schema file before the first delta that needs it; retention never
deletes one (there are as many as the partition's schemas). Snapshots and larger deltas
keep formats 2 and 3.

A format 2 or 3 delta's schema metadata also records the partition's state figures of its
version as the task reported them to Spark (`arrowstate.figures`, JSON: numTotalStateRows,
numUpdatedStateRows, numRemovedStateRows), so `state history` reads them without replaying
any rows; a reader that does not know the key passes over it (a compact delta keeps them
in its head).

Nothing in a file is used before all of it is verified: trailer, length, checksum, then
every record batch in full (Arrow's `validate(full=True)` on a view with strings as bytes:
every offset and length, without rejecting the non-UTF-8 strings Spark allows), its
columns' types, its row count and its op values. A change record is no state: it says what
one state operation did (a family whose changes are finer than its rows, transformWithState,
writes them for Spark's change feed), and a load passes over it. Format 1 files (arrowstate
0.1: the IPC stream alone, no trailer) still load, with the same full validation of their
batches.
"""
from __future__ import annotations

import io
import json
import re
import zlib
from typing import BinaryIO, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..contract import FILES
from ..errors import ArrowStateError
from . import compact, evolution
from .compact import FLAG_CHANGES, SCHEMA_SUFFIX, is_schema_file, schema_file  # noqa: F401
from .container import (FORMAT_2, FORMAT_COMPACT, FORMAT_MANIFEST,  # noqa: F401
                        FORMAT_VERSION, FORMAT_WITH_CHANGES, KIND_DELTA, KIND_RUN,
                        KIND_SNAPSHOT, MAGIC, STATE_FIGURES, TRAILER, CorruptStateFile,
                        checked_trailer, trailer, unique_id)

COMPACT_MAX_BYTES = 64 << 10   # a delta whose rows take at most this is compact (format 4)
FORMAT = FILES["format"].encode()          # format 1's schema tag
OP_COLUMN = FILES["opColumn"]
DELTA, SNAPSHOT, RUN = "delta", "snapshot", "run"
SUFFIX = {DELTA: FILES["deltaSuffix"], SNAPSHOT: FILES["snapshotSuffix"]}
RUN_SUFFIX = FILES["runSuffix"]
KIND_CODE = {DELTA: KIND_DELTA, SNAPSHOT: KIND_SNAPSHOT, RUN: KIND_RUN}
OP_PUT, OP_REMOVE = 1, 0
# change records (format 3 deltas): what a state operation did, in the row's own columns
CHANGE_UPDATE, CHANGE_APPEND, CHANGE_DELETE = 2, 3, 4
_NAME = re.compile(r"^(\d+)(" + "|".join(re.escape(s) for s in SUFFIX.values()) + r")$")
_RUN_NAME = re.compile(r"^[0-9a-f]{32}" + re.escape(RUN_SUFFIX) + "$")


class StateColumnsChanged(ArrowStateError):
    """Intact files whose columns this query cannot take: not damage (no older snapshot is
    tried instead); the message says what changed."""

    def __init__(self, path: str, context: str, what: str) -> None:
        super().__init__("STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION",
                         f"arrowstate cannot load state file {path} ({context}) into this "
                         f"query: {what}", path=path, context=context, reason=what)


COLUMN_NAME = b"arrowstate.column"   # value field metadata: the family's name of the column
FIGURES = b"arrowstate.figures"       # a delta's schema metadata: its version's state figures


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


def file_name(kind: str, version: int) -> str:
    return f"{version}{SUFFIX[kind]}"


def parse_name(name: str) -> tuple[int, str] | None:
    """(version, kind) of one of our file names, None for any other name."""
    m = _NAME.match(name)
    if m is None:
        return None
    return int(m.group(1)), DELTA if m.group(2) == SUFFIX[DELTA] else SNAPSHOT


def is_run_file(name: str) -> bool:
    """Whether `name` is a run file's (see `manifest`)."""
    return _RUN_NAME.match(name) is not None


def is_ours(name: str) -> bool:
    """Whether `name` is one of arrowstate's files (a version's delta or snapshot, a schema
    file or a run file)."""
    return parse_name(name) is not None or is_schema_file(name) or is_run_file(name)


def _name_kind(name: str) -> tuple[int | None, str] | None:
    """(version, kind) of a state file's name (version None for a run file); None for any
    other name."""
    return (None, RUN) if is_run_file(name) else parse_name(name)


# Spark's own state stores' files: the HDFS-backed provider's and RocksDB's
SPARK_STORES = {
    "Spark's HDFS-backed state store (HDFSBackedStateStoreProvider)":
        re.compile(r"^(\d+)\.(delta|snapshot)$"),
    "Spark's RocksDB state store (RocksDBStateStoreProvider)":
        re.compile(r"^(\d+)(?:_[0-9a-f-]+)?\.(zip|changelog)$"),
}


def spark_store_files(names) -> dict[str, list[int]]:
    """The versions of Spark's own state store files among `names`, per store."""
    found = {store: sorted(int(m.group(1)) for m in map(pattern.match, names) if m)
             for store, pattern in SPARK_STORES.items()}
    return {store: versions for store, versions in found.items() if versions}


def with_op(batch: pa.RecordBatch, op: int) -> pa.RecordBatch:
    ops = pa.array(np.full(batch.num_rows, op, dtype=np.int8))
    return pa.RecordBatch.from_arrays(batch.columns + [ops],
                                      names=batch.schema.names + [OP_COLUMN])


def ipc_codec(spark_codec: str | None) -> str:
    """Spark's state store codec (spark.sql.streaming.stateStore.compression.codec, a short
    name or a class) as the compression of a file's Arrow buffers. Arrow's IPC format has
    LZ4 (frame) and ZSTD only: Spark's lzf and snappy mean lz4, Spark's default."""
    name = (spark_codec or "").strip().lower()
    return "zstd" if name in ("zstd", "org.apache.spark.io.zstdcompressioncodec") else "lz4"


def _write_payload(sink, schema: pa.Schema, kind: str, version: int,
                   batches: Iterable[pa.RecordBatch], figures: dict | None = None,
                   codec: str = "lz4") -> int:
    """Writes the Arrow IPC stream of a file to `sink`, its buffers compressed with `codec`
    (an ipc_codec: any pyarrow reads either); the rows it holds."""
    meta = {b"format": FORMAT_2, b"kind": kind.encode(), b"version": str(version).encode()}
    if figures is not None:
        meta[FIGURES] = json.dumps(figures, sort_keys=True).encode()
    file_schema = schema.append(pa.field(OP_COLUMN, pa.int8())).with_metadata(meta)
    rows = 0
    options = pa.ipc.IpcWriteOptions(compression=codec)
    with pa.ipc.new_stream(sink, file_schema, options=options) as writer:
        for b in batches:
            writer.write_batch(pa.RecordBatch.from_arrays(b.columns, schema=file_schema))
            rows += b.num_rows
    return rows


def _full_trailer(kind: str, version: int, rows: int, length: int, payload_crc: int,
                  changes: bool, uid: bytes | None = None) -> tuple[bytes, bytes]:
    """A format 2 or 3 file's trailer (`container.trailer`)."""
    return trailer(KIND_CODE[kind], FORMAT_WITH_CHANGES if changes else FORMAT_VERSION, 0,
                    version, rows, length, payload_crc, uid)


def encode(schema: pa.Schema, kind: str, version: int,
           batches: Iterable[pa.RecordBatch], changes: bool = False,
           figures: dict | None = None, codec: str = "lz4", uid: bytes | None = None
           ) -> tuple[bytes, bytes]:
    """One file's bytes and its unique id (`uid` if given); `batches` carry the state
    columns plus the op column (`changes`: change records among them, a format 3 delta;
    `figures`: the state figures a delta records; `codec`: an ipc_codec)."""
    sink = pa.BufferOutputStream()
    rows = _write_payload(sink, schema, kind, version, batches, figures, codec)
    payload = sink.getvalue()
    end, uid = _full_trailer(kind, version, rows, payload.size, zlib.crc32(payload), changes,
                             uid)
    return b"".join((memoryview(payload), end)), uid


def encode_delta(schema: pa.Schema, version: int, batches: list[pa.RecordBatch],
                 changes: bool = False, figures: dict | None = None, codec: str = "lz4",
                 uid: bytes | None = None) -> tuple[bytes, bytes, str | None]:
    """A delta's bytes, its unique id, and the name of the schema file it needs (None for
    a delta that holds its schema): a compact delta (format 4) when its rows take at most
    COMPACT_MAX_BYTES, else as `encode` makes one (`codec` applies to that form only: a
    compact delta is one ZSTD frame, the smallest for a few rows)."""
    if sum(b.nbytes for b in batches) > COMPACT_MAX_BYTES:
        data, uid = encode(schema, DELTA, version, batches, changes, figures, codec, uid)
        return data, uid, None
    return compact.encode(schema, version, batches, changes, figures, uid)


class _Checksummed(io.RawIOBase):
    """A binary file that keeps the CRC-32 and length of what is written through it."""

    def __init__(self, raw: BinaryIO) -> None:
        super().__init__()
        self.raw, self.crc, self.size = raw, 0, 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.crc = zlib.crc32(b, self.crc)
        self.size += len(b)
        self.raw.write(b)
        return len(b)


def encode_to_file(path: str, schema: pa.Schema, kind: str, version: int,
                   batches: Iterable[pa.RecordBatch], codec: str = "lz4"
                   ) -> tuple[int, bytes]:
    """Writes one file (as `encode` makes it) to a local path a batch at a time, so a large
    snapshot is never whole in memory; its size and unique id."""
    with open(path, "wb") as raw:
        sink = _Checksummed(raw)
        rows = _write_payload(pa.PythonFile(sink, mode="w"), schema, kind, version, batches,
                              codec=codec)
        end, uid = _full_trailer(kind, version, rows, sink.size, sink.crc, False)
        raw.write(end)
        return sink.size + len(end), uid


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


def _stream(path: str, context: str, payload, read_schema, bad) -> tuple:
    """A file's Arrow IPC stream, its trailer's fields (None for format 1) and the highest
    op its rows may hold; every check of the trailer done."""
    version, kind = _name_kind(path.rsplit("/", 1)[-1])
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
    allowed_flags = FLAG_CHANGES if fmt == FORMAT_COMPACT else 0
    if (kind_code != KIND_CODE[kind] or (version is not None and file_version != version)
            or flags & ~allowed_flags or (fmt == FORMAT_COMPACT and kind != DELTA)):
        described = ("delta", "snapshot", "schema", "run")[kind_code % 4]
        raise bad(f"its trailer describes a {described} of version {file_version}, not "
                  f"this file's {kind}" + (f" of version {version}" if version else ""))
    changes = kind == DELTA and (fmt == FORMAT_WITH_CHANGES or flags & FLAG_CHANGES)
    highest_op = CHANGE_DELETE if changes else OP_PUT
    body = memoryview(payload)[:length]
    if fmt == FORMAT_COMPACT:
        body = compact.stream(path, context, body, read_schema, bad)
    return body, fields, highest_op


def decode(path: str, context: str, payload: bytes, schema: pa.Schema,
           dropped: frozenset = frozenset(), evolve=evolution.positional,
           read_schema=None) -> tuple[list[pa.RecordBatch], bytes | None]:
    """Every batch of one file (state columns plus the op column), all verified, and the
    file's unique id (None for format 1). Any damage is a CorruptStateFile naming `path`.
    Named columns written in an older schema are read in `schema`'s, by `evolve(name,
    column, type)` (`_by_name`). A compact delta's schema comes from `read_schema(name)`,
    the bytes of a file of its directory or None (`lifecycle.schema_reader`)."""
    if _name_kind(path.rsplit("/", 1)[-1]) is None:
        raise CorruptStateFile(path, context, "not an arrowstate state file name")

    def bad(what: str) -> CorruptStateFile:
        return CorruptStateFile(path, context, what)

    if len(payload) == 0:
        raise bad("the file is empty")
    body, fields, highest_op = _stream(path, context, payload, read_schema, bad)
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


def stored_columns(path: str, context: str, payload, read_schema=None) -> pa.Schema:
    """The state columns a file holds (its schema without the op column), its trailer and
    checksum checked; its rows are not decoded."""
    def bad(what: str) -> CorruptStateFile:
        return CorruptStateFile(path, context, what)

    body, _, _ = _stream(path, context, payload, read_schema, bad)
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


def op_runs(batch: pa.RecordBatch) -> Iterator[tuple[int, pa.RecordBatch]]:
    """A file batch as runs of one op each, in order: (op, state columns)."""
    ops = batch.column(batch.num_columns - 1).to_numpy(zero_copy_only=False)
    if len(ops) == 0:   # an empty batch (an empty partition's snapshot) has no runs
        return
    cuts = np.flatnonzero(np.diff(ops)) + 1
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(ops)]):
        yield int(ops[lo]), batch.slice(lo, hi - lo)
