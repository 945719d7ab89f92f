"""The state file format: its layout (below), the op codes and metadata keys its rows and
schemas carry. Its names are in `names`, writing in `encoding`, reading and verification in
`decoding`, the trailer in `container`, format 4's compact deltas in `compact`, format 5's
manifests in `manifest`.

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
partition keeps each schema once, in a columns file, that the delta names:

    columns file := `<id>.arrowstate.schema`: the schema's Arrow IPC message (metadata: the
                    format tag) and a trailer (format 4, kind 2, version 0, rows 0); its id,
                    32 hex digits, is the BLAKE2b-128 digest of that message
    compact delta := payload trailer (format 4, kind 0; flags bit 0: change records)
    payload := columns file id (16 bytes), the length of the messages below (u32), the state
               figures (a count byte, 0 or 3, then each as an unsigned LEB128 number),
               then the Arrow IPC messages that follow the schema in its stream (record
               batches, uncompressed buffers, end of stream) as one ZSTD frame

The worker writes a columns file before the first delta that needs it; retention never
deletes one (there are as many as the partition's schemas). Snapshots and larger deltas
keep formats 2 and 3. A columns file is not Spark's state schema file (read by
`spark_state.checkpoint_files`): it is arrowstate's alone.

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

from typing import Iterator

import numpy as np
import pyarrow as pa

from ...contract import FILES
from .container import KIND_DELTA, KIND_RUN, KIND_SNAPSHOT
from .names import DELTA, RUN, SNAPSHOT

COMPACT_MAX_BYTES = 64 << 10   # a delta whose rows take at most this is compact (format 4)
FORMAT = FILES["format"].encode()          # format 1's schema tag
OP_COLUMN = FILES["opColumn"]
KIND_CODE = {DELTA: KIND_DELTA, SNAPSHOT: KIND_SNAPSHOT, RUN: KIND_RUN}
OP_PUT, OP_REMOVE = 1, 0
# change records (format 3 deltas): what a state operation did, in the row's own columns
CHANGE_UPDATE, CHANGE_APPEND, CHANGE_DELETE = 2, 3, 4
COLUMN_NAME = b"arrowstate.column"   # value field metadata: the family's name of the column
FIGURES = b"arrowstate.figures"       # a delta's schema metadata: its version's state figures


_OPS_KEPT = 4096   # an op column of at most this many rows is a slice of a kept one
_OPS: dict[int, pa.Array] = {}


def with_op(batch: pa.RecordBatch, op: int) -> pa.RecordBatch:
    """The batch with an op column of `op` appended (a small one sliced from a kept column:
    a task's puts are a few rows, and a new column costs more than they do)."""
    n = batch.num_rows
    if n <= _OPS_KEPT:
        kept = _OPS.get(op)
        if kept is None:
            kept = _OPS[op] = pa.array(np.full(_OPS_KEPT, op, dtype=np.int8))
        ops = kept.slice(0, n)
    else:
        ops = pa.array(np.full(n, op, dtype=np.int8))
    return batch.append_column(OP_COLUMN, ops)


def op_runs(batch: pa.RecordBatch) -> Iterator[tuple[int, pa.RecordBatch]]:
    """A file batch as runs of one op each, in order: (op, state columns)."""
    ops = batch.column(batch.num_columns - 1).to_numpy(zero_copy_only=False)
    if len(ops) == 0:   # an empty batch (an empty partition's snapshot) has no runs
        return
    cuts = np.flatnonzero(np.diff(ops)) + 1
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(ops)]):
        yield int(ops[lo]), batch.slice(lo, hi - lo)
