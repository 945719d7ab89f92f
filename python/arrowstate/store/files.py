"""The state file format: its one home (names, encoding, decoding, checks).

A partition's files live in `<checkpoint>/state/<operatorId>/<partitionId>/`:
`<version>.arrowstate.delta` (the puts and removes of one version, in order) and
`<version>.arrowstate.snapshot` (every live row of one version). Each file is an Arrow IPC
stream of the key and value columns plus an `__op` column (1 put, 0 remove); its schema's
metadata names the format, the kind and the version. Data only: no pickle.
"""
from __future__ import annotations

import re
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa

from ..contract import FILES

FORMAT = FILES["format"].encode()
OP_COLUMN = FILES["opColumn"]
DELTA, SNAPSHOT = "delta", "snapshot"
SUFFIX = {DELTA: FILES["deltaSuffix"], SNAPSHOT: FILES["snapshotSuffix"]}
OP_PUT, OP_REMOVE = 1, 0
_NAME = re.compile(r"^(\d+)(" + "|".join(re.escape(s) for s in SUFFIX.values()) + r")$")


class CorruptStateFile(RuntimeError):
    """A state file that is not what its name says; the message names the file."""


def file_name(kind: str, version: int) -> str:
    return f"{version}{SUFFIX[kind]}"


def parse_name(name: str) -> tuple[int, str] | None:
    """(version, kind) of one of our file names, None for any other name."""
    m = _NAME.match(name)
    if m is None:
        return None
    return int(m.group(1)), DELTA if m.group(2) == SUFFIX[DELTA] else SNAPSHOT


def with_op(batch: pa.RecordBatch, op: int) -> pa.RecordBatch:
    ops = pa.array(np.full(batch.num_rows, op, dtype=np.int8))
    return pa.RecordBatch.from_arrays(batch.columns + [ops],
                                      names=batch.schema.names + [OP_COLUMN])


def encode(schema: pa.Schema, kind: str, version: int,
           batches: Iterable[pa.RecordBatch]) -> bytes:
    """One file's bytes; `batches` carry the state columns plus the op column."""
    file_schema = schema.append(pa.field(OP_COLUMN, pa.int8())).with_metadata(
        {b"format": FORMAT, b"kind": kind.encode(), b"version": str(version).encode()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, file_schema) as writer:
        for b in batches:
            writer.write_batch(pa.RecordBatch.from_arrays(b.columns, schema=file_schema))
    return sink.getvalue().to_pybytes()


def decode(where: str, payload: bytes, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The batches of one file (state columns plus the op column); any damage or foreign
    content is a CorruptStateFile naming `where`."""
    try:
        reader = pa.ipc.open_stream(payload)
        meta = reader.schema.metadata or {}
        if meta.get(b"format") != FORMAT:
            raise CorruptStateFile("not an arrowstate state file")
        expected = [f.type for f in schema]
        actual = [f.type for f in reader.schema][:-1]
        if actual != expected:
            raise CorruptStateFile(f"its columns {actual} are not this operator's {expected}")
        yield from reader
    except CorruptStateFile as e:
        raise CorruptStateFile(f"arrowstate: state file {where} is unusable: {e}") from e
    except (pa.ArrowInvalid, pa.ArrowException, ValueError, KeyError) as e:
        raise CorruptStateFile(f"arrowstate: state file {where} is corrupt: {e}") from e


def op_runs(batch: pa.RecordBatch) -> Iterator[tuple[int, pa.RecordBatch]]:
    """A file batch as runs of one op each, in order: (op, state columns)."""
    ops = batch.column(batch.num_columns - 1).to_numpy(zero_copy_only=False)
    cuts = np.flatnonzero(np.diff(ops)) + 1
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(ops)]):
        yield int(ops[lo]), batch.slice(lo, hi - lo)
