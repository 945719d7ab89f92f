"""Framing between the JVM operator and the Python state worker.

Integers are big-endian (Java's DataOutputStream); byte strings are length-prefixed; every
record batch is a self-contained Arrow IPC stream. Tags and the version come from
contract.json, which the shim reads too.
"""
from __future__ import annotations

import struct
from typing import BinaryIO

import pyarrow as pa

from .contract import FRAMES, PROTOCOL_VERSION

VERSION = PROTOCOL_VERSION
ERROR, READY, LIST_FILES, DATA, NO_DATA = (FRAMES[n] for n in (
    "ERROR", "READY", "LIST_FILES", "DATA", "NO_DATA"))
END, COMMITTED, LOOKUP, READ_FILE, COMMIT, FILE_TAIL, DROP = (FRAMES[n] for n in (
    "END", "COMMITTED", "LOOKUP", "READ_FILE", "COMMIT", "FILE_TAIL", "DROP"))
READ_STATE, IMPORT_STATE = FRAMES["READ_STATE"], FRAMES["IMPORT_STATE"]
INITIAL_STATE = FRAMES["INITIAL_STATE"]

_INT = struct.Struct("!i")
_LONG = struct.Struct("!q")


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


MASK_SCHEMA = pa.schema([pa.field("keep", pa.bool_(), nullable=False)])


def mask_batch(keep) -> pa.RecordBatch:
    """A keep-mask answer: which of the batch's rows the JVM emits."""
    return pa.RecordBatch.from_arrays([pa.array(keep, pa.bool_())], schema=MASK_SCHEMA)


def batch_to_ipc(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes()


def ipc_to_batch(payload: bytes) -> pa.RecordBatch:
    return pa.ipc.open_stream(payload).read_next_batch()


def ipc_schema(payload: bytes) -> pa.Schema:
    return pa.ipc.open_stream(payload).schema
