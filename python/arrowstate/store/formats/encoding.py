"""Writing a state file (the layout is in `files`): a delta or snapshot as bytes, a large
snapshot to a local file a batch at a time, and a small delta in compact form (`compact`)."""
from __future__ import annotations

import io
import json
import zlib
from typing import BinaryIO, Iterable

import pyarrow as pa

from . import compact, files
from .container import FORMAT_2, FORMAT_VERSION, FORMAT_WITH_CHANGES, trailer
from .files import FIGURES, KIND_CODE, OP_COLUMN
from .names import DELTA


def ipc_codec(spark_codec: str | None) -> str:
    """Spark's state store codec (spark.sql.streaming.stateStore.compression.codec, a short
    name or a class) as the compression of a file's Arrow buffers. Arrow's IPC format has
    LZ4 (frame) and ZSTD only: Spark's lzf and snappy mean lz4, Spark's default."""
    name = (spark_codec or "").strip().lower()
    return "zstd" if name in ("zstd", "org.apache.spark.io.zstdcompressioncodec") else "lz4"


def _write_payload(sink, schema: pa.Schema, kind: str, version: int,
                   batches: Iterable[pa.RecordBatch], figures: dict | None = None,
                   codec: str | None = "lz4") -> int:
    """Writes the Arrow IPC stream of a file to `sink`, its buffers compressed with `codec`
    (an ipc_codec, or None for none: any pyarrow reads each); the rows it holds."""
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
                  changes: bool, uid: bytes | None = None, base: bytes | None = None
                  ) -> tuple[bytes, bytes]:
    """A format 2 or 3 file's trailer (`container.trailer`)."""
    return trailer(KIND_CODE[kind], FORMAT_WITH_CHANGES if changes else FORMAT_VERSION, 0,
                   version, rows, length, payload_crc, uid, base)


def encode(schema: pa.Schema, kind: str, version: int,
           batches: Iterable[pa.RecordBatch], changes: bool = False,
           figures: dict | None = None, codec: str | None = "lz4", uid: bytes | None = None,
           base: bytes | None = None) -> tuple[bytes, bytes]:
    """One file's bytes and its unique id (`uid` if given); `batches` carry the state
    columns plus the op column (`changes`: change records among them, a format 3 delta;
    `figures`: the state figures a delta records; `codec`: an ipc_codec; `base`: the
    checkpoint id of the version a delta builds on, `container.FLAG_BASE`)."""
    sink = pa.BufferOutputStream()
    rows = _write_payload(sink, schema, kind, version, batches, figures, codec)
    payload = sink.getvalue()
    end, uid = _full_trailer(kind, version, rows, payload.size, zlib.crc32(payload), changes,
                             uid, base)
    return b"".join((memoryview(payload), end)), uid


def encode_delta(schema: pa.Schema, version: int, batches: list[pa.RecordBatch],
                 changes: bool = False, figures: dict | None = None, codec: str = "lz4",
                 uid: bytes | None = None, base: bytes | None = None
                 ) -> tuple[bytes, bytes, str | None]:
    """A delta's bytes, its unique id, and the name of the columns file it needs (None for
    a delta that holds its schema): a compact delta (format 4) when its rows take at most
    files.COMPACT_MAX_BYTES, else as `encode` makes one (`codec` applies to that form only: a
    compact delta is one ZSTD frame, the smallest for a few rows)."""
    # the buffers' sizes (each counted once) settle a small delta at once: nbytes walks
    # every array's ranges (10 us a small batch); either form reads back the same
    if (sum(b.get_total_buffer_size() for b in batches) > files.COMPACT_MAX_BYTES
            and sum(b.nbytes for b in batches) > files.COMPACT_MAX_BYTES):
        data, uid = encode(schema, DELTA, version, batches, changes, figures, codec, uid,
                           base)
        return data, uid, None
    return compact.encode(schema, version, batches, changes, figures, uid, base)


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
                   batches: Iterable[pa.RecordBatch], codec: str = "lz4",
                   uid: bytes | None = None) -> tuple[int, bytes]:
    """Writes one file (as `encode` makes it) to a local path a batch at a time, so a large
    snapshot is never whole in memory; its size and unique id (`uid` if given)."""
    with open(path, "wb") as raw:
        sink = _Checksummed(raw)
        rows = _write_payload(pa.PythonFile(sink, mode="w"), schema, kind, version, batches,
                              codec=codec)
        end, uid = _full_trailer(kind, version, rows, sink.size, sink.crc, False, uid)
        raw.write(end)
        return sink.size + len(end), uid
