"""The Python side's one codec of the conversation with the JVM operator.

Every frame is a tag and a body whose fields contract.json declares (`frames`, with the types
of `frameTypes`): integers big-endian (Java's DataOutputStream), byte strings
length-prefixed, Arrow batches as self-contained IPC streams, JSON payloads checked against
their schemas (`payloads`) as they cross (a sharedJson text once, however often it comes),
and files of any size as a stream of bounded
chunks (`chunks`: sent from a `Chunks`, read as a `ChunkReader` the caller drains before
the next frame). The shim's twin is FrameCodec.scala; both read the
same declaration, so a field renamed or retyped on one side fails at the boundary, naming it.
"""
from __future__ import annotations

import collections
import json
import struct
from typing import Any, BinaryIO, Iterator, NamedTuple

import pyarrow as pa

from . import arrow_stream
from .contract import (CONTRACT_VIOLATION, FRAME_SPECS, METRICS, PROTOCOL_VERSION, Frame,
                       check_payload)
from .errors import ArrowStateError

VERSION = PROTOCOL_VERSION
ERROR, READY, LIST_FILES, DATA, NO_DATA = (FRAME_SPECS[n].tag for n in (
    "ERROR", "READY", "LIST_FILES", "DATA", "NO_DATA"))
END, COMMITTED, LOOKUP, READ_FILE, COMMIT, FILE_TAIL, DROP = (FRAME_SPECS[n].tag for n in (
    "END", "COMMITTED", "LOOKUP", "READ_FILE", "COMMIT", "FILE_TAIL", "DROP"))
READ_STATE, IMPORT_STATE = FRAME_SPECS["READ_STATE"].tag, FRAME_SPECS["IMPORT_STATE"].tag
INITIAL_STATE, HELLO, TASK, PRE_INIT = (FRAME_SPECS[n].tag for n in (
    "INITIAL_STATE", "HELLO", "TASK", "PRE_INIT"))
_BY_TAG: dict[int, Frame] = {f.tag: f for f in FRAME_SPECS.values()}

_INT = struct.Struct("!i")
_LONG = struct.Struct("!q")
_METRIC = struct.Struct("!iq")   # a `metrics` item: the metric's place, its value
_METRIC_NAMES: tuple[str, ...] = tuple(METRICS)
_METRIC_PLACES: dict[str, int] = {name: i for i, name in enumerate(_METRIC_NAMES)}


def _violation(payload: str, field: str, reason: str) -> Exception:
    return ArrowStateError(CONTRACT_VIOLATION, f"frame {payload}: {reason}",
                           payload=payload, field=field, reason=reason)


def read_exact(f: BinaryIO, n: int) -> bytes:
    b = f.read(n)
    if b is None or len(b) != n:
        raise EOFError("arrowstate: the JVM closed the connection")
    return b


def read_int(f: BinaryIO) -> int:
    return _INT.unpack(read_exact(f, 4))[0]


def write_int(f: BinaryIO, v: int) -> None:
    f.write(_INT.pack(v))


def write_long(f: BinaryIO, v: int) -> None:
    f.write(_LONG.pack(v))


def read_bytes(f: BinaryIO) -> bytes:
    return read_exact(f, read_int(f))


def read_long(f: BinaryIO) -> int:
    return _LONG.unpack(read_exact(f, 8))[0]


def read_str(f: BinaryIO) -> str:
    return read_bytes(f).decode("utf-8")


def write_str(f: BinaryIO, s: str) -> None:
    write_bytes(f, s.encode("utf-8"))


def write_bytes(f: BinaryIO, b: bytes) -> None:
    write_int(f, len(b))
    f.write(b)


class Chunks(NamedTuple):
    """A `chunks` value to send: a file's bytes (any bytes-like object), in chunks of at
    most `chunk_bytes` (spark.arrowstate.worker.fileChunkBytes)."""
    data: Any
    chunk_bytes: int


def write_chunks(f: BinaryIO, data, chunk_bytes: int) -> None:
    """The bytes as chunks of at most `chunk_bytes`, then the empty chunk; no copy."""
    view = memoryview(data).cast("B")
    for lo in range(0, len(view), chunk_bytes):
        piece = view[lo:lo + chunk_bytes]
        write_int(f, len(piece))
        f.write(piece)
    write_int(f, 0)


class ChunkReader:
    """A `chunks` field as it comes: its chunks in turn, ended by the empty one. It must be
    read to its end before the next frame."""

    def __init__(self, f: BinaryIO, frame: str, field: str) -> None:
        self._f, self.frame, self.field = f, frame, field
        self.ended = False

    def chunks(self) -> Iterator[bytes]:
        """Each chunk's bytes; a stream that stops before the empty chunk is an EOFError
        naming the field."""
        while not self.ended:
            try:
                n = read_int(self._f)
                if n < 0:
                    raise _violation(self.frame, self.field, f"a chunk of length {n}")
                if n == 0:
                    self.ended = True
                    return
                yield read_exact(self._f, n)
            except EOFError:
                raise EOFError(f"arrowstate: the JVM's connection closed in the middle of "
                               f"{self.frame}.{self.field}, before its last chunk") from None

    def read_all(self) -> bytes:
        return b"".join(self.chunks())


def _write_value(f: BinaryIO, frame: str, field: str, kind: str, value: Any) -> None:
    if kind == "chunks":
        if not isinstance(value, Chunks) or value.chunk_bytes < 1:
            raise _violation(frame, field, f"must be Chunks with a positive chunk size, not "
                                           f"{type(value).__name__}")
        write_chunks(f, value.data, value.chunk_bytes)
    elif kind == "int":
        write_int(f, value)
    elif kind == "long":
        write_long(f, value)
    elif kind in ("bytes", "arrow"):
        write_bytes(f, value)
    elif kind == "string":
        write_str(f, value)
    elif kind == "strings":
        write_int(f, len(value))
        for s in value:
            write_str(f, s)
    elif kind == "namedFiles":
        write_int(f, len(value))
        for name, content in value:   # a local file's path, or a small file's bytes
            write_str(f, name)
            write_str(f, content if isinstance(content, str) else "")
            write_bytes(f, b"" if isinstance(content, str) else content)
    elif kind == "metrics":
        write_int(f, len(value))
        try:
            f.write(b"".join([_METRIC.pack(_METRIC_PLACES[name], v)
                              for name, v in value.items()]))
        except (KeyError, struct.error) as e:
            bad = next((n, v) for n, v in value.items() if n not in _METRIC_PLACES
                       or not isinstance(v, int) or not -2**63 <= v < 2**63)
            raise _violation(frame, f"{field}.{bad[0]}",
                             f"{bad[0]}={bad[1]!r} is not a declared metric's integer "
                             f"value") from e
    elif kind.startswith("optionalJson:") and value is None:
        write_bytes(f, b"")
    elif kind.startswith(("json:", "sharedJson:", "optionalJson:")):
        check_payload(kind.partition(":")[2], value)
        write_bytes(f, json.dumps(value).encode())
    else:
        raise _violation(frame, field, f"unknown field type {kind!r}")


def _read_value(f: BinaryIO, frame: str, field: str, kind: str) -> Any:
    if kind == "chunks":
        return ChunkReader(f, frame, field)
    if kind == "int":
        return read_int(f)
    if kind == "long":
        return read_long(f)
    if kind in ("bytes", "arrow"):
        return read_bytes(f)
    if kind == "string":
        return read_str(f)
    if kind == "strings":
        return [read_str(f) for _ in range(read_int(f))]
    if kind == "namedFiles":   # (name, a local file's path or a small file's bytes)
        named = []
        for _ in range(read_int(f)):
            name, path, content = read_str(f), read_str(f), read_bytes(f)
            named.append((name, path or content))
        return named
    if kind == "metrics":
        metrics = {}
        for _ in range(read_int(f)):
            place, value = _METRIC.unpack(read_exact(f, _METRIC.size))
            if not 0 <= place < len(_METRIC_NAMES):
                raise _violation(frame, field, f"no metric is declared at place {place}")
            metrics[_METRIC_NAMES[place]] = value
        return metrics
    if kind.startswith("sharedJson:"):
        return _shared_json(read_bytes(f), kind[11:])
    if kind.startswith(("json:", "optionalJson:")):
        text = read_bytes(f)
        if not text and kind.startswith("optionalJson:"):   # none
            return None
        value = json.loads(text)
        check_payload(kind.partition(":")[2], value)
        return value
    raise _violation(frame, field, f"unknown field type {kind!r}")


_SHARED: dict[tuple[bytes, str], Any] = {}   # (text, payload) -> the value read from it


def _shared_json(text: bytes, payload: str) -> Any:
    """A sharedJson field's value: parsed and checked the first time its text comes, the
    same (read-only) value after that. A handful of texts live at once (one per operator
    and micro-batch a worker serves), so the oldest go once there are more."""
    value = _SHARED.get((text, payload))
    if value is None:
        value = json.loads(text)
        check_payload(payload, value)
        if len(_SHARED) >= 64:
            del _SHARED[next(iter(_SHARED))]
        _SHARED[(text, payload)] = value
    return value


def _write_body(f: BinaryIO, frame: str, fields, values: tuple) -> None:
    if fields is None:
        raise _violation(frame, "", "the worker does not send this frame")
    if len(values) != len(fields):
        raise _violation(frame, "", f"{len(values)} values for fields "
                                    f"{[n for n, _ in fields]}")
    for (name, kind), value in zip(fields, values):
        _write_value(f, frame, name, kind, value)


def send(f: BinaryIO, name: str, *values: Any) -> None:
    """Writes frame `name` (as the worker sends it) with its body's values, unflushed."""
    frame = FRAME_SPECS[name]
    write_int(f, frame.tag)
    _write_body(f, name, frame.from_python, values)


def receive(f: BinaryIO, *expected: str) -> tuple[str, list[Any]]:
    """The JVM's next frame, one of `expected`: its name and its body's values."""
    return _frame(f, read_int(f), expected)


def _frame(f: BinaryIO, tag: int, expected: tuple[str, ...]) -> tuple[str, list[Any]]:
    frame = _BY_TAG.get(tag)
    if frame is None or frame.name not in expected or frame.from_jvm is None:
        raise _violation(frame.name if frame else str(tag), "",
                         f"expected {' or '.join(expected)} from the JVM, got "
                         f"{frame.name if frame else f'unknown tag {tag}'}")
    return frame.name, [_read_value(f, frame.name, n, k) for n, k in frame.from_jvm]


# What a task's JVM may send before it reads the worker's READY (it does not wait for it):
# a request's reply comes after these, which the task then reads first.
TASK_INPUT = ("DATA", "LOOKUP", "INITIAL_STATE", "END")


def request(f: BinaryIO, name: str, *values: Any,
            early: collections.deque | None = None) -> list[Any]:
    """Sends request `name` and reads the JVM's reply to it (tagged with the request's tag).
    The task's input frames that came before the reply go to `early`, in order (None: none
    may come)."""
    send(f, name, *values)
    f.flush()
    spec = FRAME_SPECS[name]
    while (tag := read_int(f)) != spec.tag:
        if early is None:
            raise _violation(name, "", f"expected the JVM's reply to {name}, got tag {tag}")
        early.append(_frame(f, tag, TASK_INPUT + (f"the reply to {name}",)))
    return [_read_value(f, name, n, k) for n, k in spec.reply]


MASK_SCHEMA = pa.schema([pa.field("keep", pa.bool_(), nullable=False)])


def mask_batch(keep) -> pa.RecordBatch:
    """A keep-mask answer: which of the batch's rows the JVM emits."""
    return pa.RecordBatch.from_arrays([pa.array(keep, pa.bool_())], schema=MASK_SCHEMA)


# An `arrow` value is an IPC stream of one batch, written as its messages (`arrow_stream`);
# read after its schema's message when that schema came before
_KNOWN_SCHEMAS: list[tuple[bytes, pa.Schema]] = []   # (schema's IPC message, schema)
batch_to_ipc = arrow_stream.stream


def ipc_to_batch(payload: bytes) -> pa.RecordBatch:
    """The batch of an `arrow` value: read after the schema's message when that schema
    came before (a task's batches share one or two), else by pyarrow's stream reader."""
    for message, schema in _KNOWN_SCHEMAS:
        if payload.startswith(message):
            return pa.ipc.read_record_batch(pa.py_buffer(payload)[len(message):], schema)
    reader = pa.ipc.open_stream(payload)
    batch = reader.read_next_batch()
    # the schema's message as this writer wrote it (Arrow Java pads it otherwise than
    # pyarrow): the continuation marker, the metadata's length, the metadata
    message = payload[:8 + int.from_bytes(payload[4:8], "little")]
    if payload[:4] == arrow_stream.EOS[:4] and not arrow_stream.has_dictionary(reader.schema):
        if len(_KNOWN_SCHEMAS) >= 8:
            _KNOWN_SCHEMAS.pop()
        _KNOWN_SCHEMAS.insert(0, (message, reader.schema))
    return batch


def ipc_schema(payload: bytes) -> pa.Schema:
    return pa.ipc.open_stream(payload).schema
