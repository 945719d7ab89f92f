"""Format 4, a compact delta: a small delta that names its partition's schema file instead
of carrying its schema (the layout is in `files`). At 10 rows the schema was most of a
delta's bytes; the partition keeps each schema once, in `<id>.arrowstate.schema`."""
from __future__ import annotations

import hashlib
import re
import struct
import zlib

import pyarrow as pa

from ..contract import FILES
from .container import (FORMAT_2, FORMAT_COMPACT, KIND_DELTA, KIND_SCHEMA, STATE_FIGURES,
                        CorruptStateFile, checked_trailer, trailer)

FLAG_CHANGES = 1               # the trailer's flag: change records among the rows
SCHEMA_SUFFIX = FILES["schemaSuffix"]
_SCHEMA_NAME = re.compile(r"^[0-9a-f]{32}" + re.escape(SCHEMA_SUFFIX) + "$")
_HEAD = struct.Struct("<16sI")   # schema id, length of the messages
_MADE: dict[int, tuple] = {}   # id(schema) -> (schema, what file_schema made of it)


def is_schema_file(name: str) -> bool:
    return _SCHEMA_NAME.match(name) is not None


def _schema_name(schema_id: bytes) -> str:
    return f"{schema_id.hex()}{SCHEMA_SUFFIX}"


def file_schema(schema: pa.Schema) -> tuple[pa.Schema, pa.Buffer, str]:
    """The schema a schema file holds (the state columns, the op column, the format tag),
    its IPC message and the schema file's name. Made once per schema object: a state
    commits with the same one every time. (Kept by identity: pyarrow's schema equality
    ignores field metadata, which names a family's columns.)"""
    made = _MADE.get(id(schema))
    if made is not None and made[0] is schema:
        return made[1]
    with_op = schema.append(pa.field(FILES["opColumn"], pa.int8())).with_metadata(
        {b"format": FORMAT_2})
    message = with_op.serialize()
    digest = hashlib.blake2b(message, digest_size=16).digest()
    made = (with_op, message, _schema_name(digest))
    if len(_MADE) >= 256:
        _MADE.clear()
    _MADE[id(schema)] = (schema, made)   # the schema held: its id is not reused meanwhile
    return made


def schema_file(schema: pa.Schema) -> tuple[str, bytes]:
    """The name and bytes of the schema file that holds `schema` (the state columns)."""
    _, message, name = file_schema(schema)
    end, _ = trailer(KIND_SCHEMA, FORMAT_COMPACT, 0, 0, 0, message.size, zlib.crc32(message))
    return name, message.to_pybytes() + end


def _leb128(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def encode(schema: pa.Schema, version: int, batches: list[pa.RecordBatch], changes: bool,
           figures: dict | None, uid: bytes | None = None) -> tuple[bytes, bytes, str]:
    """A compact delta's bytes, its unique id (`uid` if given), and the name of the schema
    file it needs."""
    with_op, message, name = file_schema(schema)
    sink = pa.BufferOutputStream()
    rows = 0
    with pa.ipc.new_stream(sink, with_op) as writer:
        for b in batches:
            writer.write_batch(pa.RecordBatch.from_arrays(b.columns, schema=with_op))
            rows += b.num_rows
    stream = sink.getvalue()
    if not stream.slice(0, message.size).equals(message):   # what `stream` puts back
        raise AssertionError("an Arrow stream that does not begin with its schema message")
    messages = stream.slice(message.size)
    counted = [] if figures is None else [_leb128(int(figures[k])) for k in STATE_FIGURES]
    payload = b"".join([_HEAD.pack(bytes.fromhex(name[:32]), messages.size),
                        bytes([len(counted)]), *counted,
                        pa.compress(messages, codec="zstd", asbytes=True)])
    end, uid = trailer(KIND_DELTA, FORMAT_COMPACT, FLAG_CHANGES if changes else 0, version,
                       rows, len(payload), zlib.crc32(payload), uid)
    return payload + end, uid, name


def head(body, bad) -> tuple[bytes, int, dict | None, int]:
    """A compact delta's schema id, messages' length, figures and where its frame starts."""
    if len(body) < _HEAD.size + 1:
        raise bad("it is too short for a compact delta")
    schema_id, length = _HEAD.unpack(body[:_HEAD.size])
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
    return schema_id, length, dict(zip(STATE_FIGURES, numbers)) if numbers else None, at


def _schema_message(path: str, context: str, schema_id: bytes, read_schema) -> bytes:
    """The verified schema message of the schema file `schema_id` names, beside `path`."""
    name = _schema_name(schema_id)
    data = read_schema(name) if read_schema is not None else None
    if data is None:
        raise CorruptStateFile(path, context, f"the schema file it names, {name}, is missing "
                                              "from its directory")
    where = f"{path.rsplit('/', 1)[0]}/{name}"

    def bad(what: str) -> CorruptStateFile:
        return CorruptStateFile(where, context, what)

    fields = checked_trailer(data, bad)
    if fields is None or fields[1] != FORMAT_COMPACT or fields[2] != KIND_SCHEMA:
        raise bad("it is not an arrowstate schema file")
    message = bytes(memoryview(data)[:fields[7]])
    if hashlib.blake2b(message, digest_size=16).digest() != schema_id:
        raise bad("its schema is not the one its name says (damaged, or renamed)")
    return message


def stream(path: str, context: str, body, read_schema, bad) -> memoryview:
    """A compact delta's payload as the Arrow IPC stream it stands for: the schema from the
    schema file it names (`read_schema(name)`: its bytes, or None), then its messages."""
    schema_id, size, _, at = head(body, bad)
    try:
        messages = pa.decompress(body[at:], decompressed_size=size, codec="zstd")
    except (pa.ArrowException, ValueError) as e:
        raise bad(f"its rows cannot be decompressed: {e}") from e
    message = _schema_message(path, context, schema_id, read_schema)
    return memoryview(message + messages.to_pybytes())
