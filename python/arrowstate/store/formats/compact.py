"""Format 4, a compact delta: a small delta that names its partition's columns file instead
of carrying its Arrow schema (the layout is in `files`). At 10 rows the schema was most of a
delta's bytes; the partition keeps each once, in a columns file `<id>.arrowstate.schema`
(`names`). A columns file is ours alone: Spark's state schema file (a partition's
`_metadata/schema`, transformWithState's `_stateSchema/`) is another thing, read by
`spark_state.checkpoint_files`."""
from __future__ import annotations

import hashlib
import struct
import threading
import zlib

import pyarrow as pa
import zstandard

from ... import arrow_stream
from ...contract import FILES
from .container import (FORMAT_2, FORMAT_COMPACT, KIND_COLUMNS, KIND_DELTA, STATE_FIGURES,
                        CorruptStateFile, checked_trailer, trailer)
from .names import columns_file_name

FLAG_CHANGES = 1               # the trailer's flag: change records among the rows
_HEAD = struct.Struct("<16sI")   # columns file id, length of the messages
_MADE: dict[int, tuple] = {}   # id(schema) -> (schema, what file_schema made of it)
# a ZSTD compressor kept per thread: its context is made once, where Arrow's compress makes
# one a call (about 25 us, most of a small delta's compression)
_COMPRESSORS = threading.local()


def _compressed(data) -> bytes:
    compressor = getattr(_COMPRESSORS, "zstd", None)
    if compressor is None:
        compressor = _COMPRESSORS.zstd = zstandard.ZstdCompressor(level=1)
    return compressor.compress(data)


def file_schema(schema: pa.Schema) -> tuple[pa.Schema, pa.Buffer, str]:
    """The schema a columns file holds (the state columns, the op column, the format tag),
    its IPC message and the columns file's name.
    Made once per schema object: a state commits with the same one every time. (Kept by
    identity: pyarrow's schema equality ignores field metadata, which names a family's
    columns.)"""
    made = _MADE.get(id(schema))
    if made is not None and made[0] is schema:
        return made[1]
    with_op = schema.append(pa.field(FILES["opColumn"], pa.int8())).with_metadata(
        {b"format": FORMAT_2})
    message = with_op.serialize()
    digest = hashlib.blake2b(message, digest_size=16).digest()
    made = (with_op, message, columns_file_name(digest))
    if len(_MADE) >= 256:
        _MADE.clear()
    _MADE[id(schema)] = (schema, made)   # the schema held: its id is not reused meanwhile
    return made


def columns_file(schema: pa.Schema) -> tuple[str, bytes]:
    """The name and bytes of the columns file that holds `schema` (the state columns)."""
    _, message, name = file_schema(schema)
    end, _ = trailer(KIND_COLUMNS, FORMAT_COMPACT, 0, 0, 0, message.size, zlib.crc32(message))
    return name, message.to_pybytes() + end


def _leb128(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def encode(schema: pa.Schema, version: int, batches: list[pa.RecordBatch], changes: bool,
           figures: dict | None, uid: bytes | None = None, base: bytes | None = None
           ) -> tuple[bytes, bytes, str]:
    """A compact delta's bytes, its unique id (`uid` if given), and the name of the columns
    file it needs; `base`: the checkpoint id of the version it builds on (FLAG_BASE)."""
    with_op, message, name = file_schema(schema)
    rows = sum(b.num_rows for b in batches)
    # the stream's messages after the schema's (which the columns file holds, and a read
    # puts back)
    messages = arrow_stream.after_schema(with_op, message, batches)
    counted = [] if figures is None else [_leb128(int(figures[k])) for k in STATE_FIGURES]
    payload = b"".join([_HEAD.pack(bytes.fromhex(name[:32]), messages.size),
                        bytes([len(counted)]), *counted,
                        _compressed(messages)])
    end, uid = trailer(KIND_DELTA, FORMAT_COMPACT, FLAG_CHANGES if changes else 0, version,
                       rows, len(payload), zlib.crc32(payload), uid, base)
    return payload + end, uid, name


def head(body, bad) -> tuple[bytes, int, dict | None, int]:
    """A compact delta's columns file id, messages' length, figures and where its frame
    starts."""
    if len(body) < _HEAD.size + 1:
        raise bad("it is too short for a compact delta")
    columns_id, length = _HEAD.unpack(body[:_HEAD.size])
    at, numbers = _HEAD.size + 1, []
    for _ in range(body[_HEAD.size]):
        n = shift = 0
        while True:
            if at >= len(body) or shift > 63:
                raise bad("its state figures are cut short")
            n |= (body[at] & 0x7F) << shift
            at, shift = at + 1, shift + 7
            if not body[at - 1] & 0x80:
                break
        numbers.append(n)
    if numbers and len(numbers) != len(STATE_FIGURES):
        raise bad(f"it records {len(numbers)} state figures, not {len(STATE_FIGURES)}")
    return columns_id, length, dict(zip(STATE_FIGURES, numbers)) if numbers else None, at


def _schema_message(path: str, context: str, columns_id: bytes, read_columns) -> bytes:
    """The verified schema message of the columns file `columns_id` names, beside `path`."""
    name = columns_file_name(columns_id)
    data = read_columns(name) if read_columns is not None else None
    if data is None:
        raise CorruptStateFile(path, context, f"the columns file it names, {name}, is missing "
                                              "from its directory")
    where = f"{path.rsplit('/', 1)[0]}/{name}"

    def bad(what: str) -> CorruptStateFile:
        return CorruptStateFile(where, context, what)

    fields = checked_trailer(data, bad)
    if fields is None or fields[1] != FORMAT_COMPACT or fields[2] != KIND_COLUMNS:
        raise bad("it is not an arrowstate columns file")
    message = bytes(memoryview(data)[:fields[7]])
    if hashlib.blake2b(message, digest_size=16).digest() != columns_id:
        raise bad("its schema is not the one its name says (damaged, or renamed)")
    return message


def stream(path: str, context: str, body, read_columns, bad) -> memoryview:
    """A compact delta's payload as the Arrow IPC stream it stands for: the schema from the
    columns file it names (`read_columns(name)`: its bytes, or None), then its messages."""
    columns_id, size, _, at = head(body, bad)
    try:
        messages = pa.decompress(body[at:], decompressed_size=size, codec="zstd")
    except (pa.ArrowException, ValueError) as e:
        raise bad(f"its rows cannot be decompressed: {e}") from e
    message = _schema_message(path, context, columns_id, read_columns)
    return memoryview(message + messages.to_pybytes())
