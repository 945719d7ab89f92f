"""Snapshots that name the tier's runs instead of rewriting every row (format 5): what a
snapshot of a large state writes is the runs made since the one before.

The tier's runs never change (`tier`), so a run written to the checkpoint once serves every
later snapshot that still holds it, as Spark's RocksDB store uploads an SST file once:

    run file := `<32 hex>.arrowstate.run`: a format 2 file (trailer kind 3) of a piece of
                one run: its entries in the tier's key order, each a put (op 1, the row) or a
                removal that hides older runs' row of its key (op 0, the key columns, values
                null); a run is cut into pieces of at most PIECE_BYTES of rows, so no file
                is held whole in memory or crosses in one frame
    manifest := the version's `<version>.arrowstate.snapshot` in format 5: a JSON payload
                {"runs": [[piece, ...], ...] (oldest run first; a piece is {"name", "bytes",
                "rows", "uid"}: its size, entry count and trailer's unique id), "seeds": the
                key hash seeds the runs' order follows, "rows": the live rows} then the
                trailer (format 5, kind 1, rows: the live rows)

A load takes the manifest's runs into the tier as they are (no merge, no re-sort), then the
deltas after it. A run file missing, damaged, or not the one the manifest names (its size
or unique id) fails the manifest like a damaged snapshot: an older snapshot and the deltas
after it are loaded instead, with a warning, or the load fails naming the file.
"""
from __future__ import annotations

import json
import os
import uuid
import zlib
from typing import Callable, Iterator, NamedTuple, Sequence

import numpy as np
import pyarrow as pa

from ..tier.merging import MERGE_ROWS
from ..tier.runs import Run, RunFiles, RunReader
from . import encoding, files, names
from .container import (FORMAT_MANIFEST, KIND_SNAPSHOT, MAGIC, TRAILER, CorruptStateFile,
                        checked_trailer, trailer)

# rows (Arrow's in-memory size) and entries a run file holds at most: small enough that a
# snapshot's files ship a few a micro-batch (lifecycle), large enough to keep requests few
PIECE_BYTES = 8 << 20
PIECE_ROWS = 1 << 18
_TAG = "arrowstate-manifest-1"


class Piece(NamedTuple):
    """One run file as a manifest names it."""
    name: str
    bytes: int
    rows: int
    uid: str      # its trailer's unique id, hex


class Manifest(NamedTuple):
    runs: list[list[Piece]]      # oldest run first, each run's pieces in key order
    seeds: tuple[int, int]
    rows: int

    def names(self) -> set[str]:
        return {p.name for run in self.runs for p in run}


class Written(NamedTuple):
    """A manifest made: the files to write, in order (new run files, then the manifest;
    each as bytes or a local file's path), the runs whose files it wrote (their `RunFiles`
    cells, to mark once shipped) and the names it took from earlier snapshots."""
    files: list[tuple[str, bytes | str]]
    new_runs: list[tuple[RunFiles, tuple[Piece, ...]]]
    reused: set[str]
    manifest: Manifest


def run_file_name() -> str:
    return uuid.uuid4().hex + names.RUN_SUFFIX


def write(runs: Sequence[tuple[Run, RunReader]], schema: pa.Schema, version: int,
          seeds: tuple[int, int], live_rows: int, directory: str | None,
          codec: str, checkpoint_id: str | None = None) -> Written:
    """The manifest of `version` over the frozen tier's runs (oldest first), writing the
    runs not yet in the checkpoint (`Run.pieces` None) as run files: local files in
    `directory` (else bytes). `checkpoint_id`: the version's, under checkpoint format v2
    (in the manifest's name and as its unique id)."""
    out: list[tuple[str, bytes | str]] = []
    try:
        return _write(runs, schema, version, seeds, live_rows, directory, codec, out,
                      checkpoint_id)
    except BaseException:   # the files written so far go
        for _, content in out:
            if isinstance(content, str) and os.path.exists(content):
                os.remove(content)
        raise


def _write(runs, schema, version, seeds, live_rows, directory, codec, out,
           checkpoint_id) -> Written:
    listed, new_runs, reused = [], [], set()
    for run, reader in runs:
        if run.n == 0:   # an empty run (all removals, merged at the bottom) hides nothing
            continue
        if run.pieces is not None:
            listed.append(list(run.pieces))
            reused.update(p.name for p in run.pieces)
            continue
        pieces = []
        for piece, content in _write_run(reader, schema, version, directory, codec):
            pieces.append(piece)
            out.append((piece.name, content))
        listed.append(pieces)
        new_runs.append((run.files, tuple(pieces)))
    made = Manifest(listed, seeds, live_rows)
    data = encode(made, version, checkpoint_id)
    name = names.file_name(names.SNAPSHOT, version, checkpoint_id)
    if directory is None:
        out.append((name, data))
    else:
        path = os.path.join(directory, f"{uuid.uuid4().hex}-{name}")
        with open(path, "wb") as f:
            f.write(data)
        out.append((name, path))
    return Written(out, new_runs, reused, made)


def _write_run(reader: RunReader, schema: pa.Schema, version: int, directory: str | None,
               codec: str) -> Iterator[tuple[Piece, bytes | str]]:
    """A run's entries as run files of at most PIECE_BYTES of rows (PIECE_ROWS entries)."""
    n = reader.run.n
    lo = 0
    while lo < n:
        chunks, hi = _piece_chunks(reader, lo, n)
        name = run_file_name()
        if directory is None:
            data, uid = encoding.encode(schema, names.RUN, version, chunks)
            yield Piece(name, len(data), hi[0] - lo, uid.hex()), data
        else:
            path = os.path.join(directory, f"{uuid.uuid4().hex}-{name}")
            try:
                size, uid = encoding.encode_to_file(path, schema, names.RUN, version, chunks,
                                                    codec)
            except BaseException:
                if os.path.exists(path):
                    os.remove(path)
                raise
            yield Piece(name, size, hi[0] - lo, uid.hex()), path
        lo = hi[0]


def _piece_chunks(reader: RunReader, lo: int, n: int) -> tuple[Iterator, list[int]]:
    """The entries of one piece from `lo`, as file batches (state columns and op), and a
    cell holding where it ends once they are consumed."""
    end = [lo]

    def chunks() -> Iterator[pa.RecordBatch]:
        at, size = lo, 0
        while at < n and at - lo < PIECE_ROWS and size < PIECE_BYTES:
            hi = min(at + MERGE_ROWS, n, lo + PIECE_ROWS)
            rows, alive = reader.rows(at, hi), reader.alive(at, hi)
            ops = pa.array(np.where(alive, files.OP_PUT, files.OP_REMOVE).astype(np.int8))
            yield pa.RecordBatch.from_arrays(rows.columns + [ops],
                                             names=rows.schema.names + [files.OP_COLUMN])
            size += rows.nbytes
            at = hi
            end[0] = at
    return chunks(), end


def encode(made: Manifest, version: int, checkpoint_id: str | None = None) -> bytes:
    payload = json.dumps({
        "format": _TAG, "seeds": list(made.seeds), "rows": made.rows,
        "runs": [[p._asdict() for p in run] for run in made.runs]},
        separators=(",", ":")).encode()
    end, _ = trailer(KIND_SNAPSHOT, FORMAT_MANIFEST, 0, version, made.rows, len(payload),
                     zlib.crc32(payload),
                     names.checkpoint_uid(checkpoint_id))
    return payload + end


def read(path: str, context: str, payload) -> Manifest | None:
    """The manifest a snapshot file holds, every check of its trailer done; None for a
    snapshot of rows (formats 1 to 3)."""
    def bad(what: str) -> CorruptStateFile:
        return CorruptStateFile(path, context, what)

    if len(payload) == 0:
        raise bad("the file is empty")
    fields = checked_trailer(payload, bad)
    if fields is None or fields[1] != FORMAT_MANIFEST:
        return None
    version = names.parse_name(path.rsplit("/", 1)[-1])
    if fields[2] != KIND_SNAPSHOT or version is None or fields[5] != version[0]:
        raise bad(f"its trailer describes a manifest of version {fields[5]}, not this "
                  "file's snapshot")
    mismatch = names.id_mismatch(path.rsplit("/", 1)[-1], fields[8])
    if mismatch is not None:
        raise bad(mismatch)
    try:
        body = json.loads(bytes(memoryview(payload)[:fields[7]]))
        if body.get("format") != _TAG:
            raise ValueError(f"tagged {body.get('format')!r}, not {_TAG!r}")
        runs = [[Piece(str(p["name"]), int(p["bytes"]), int(p["rows"]), str(p["uid"]))
                 for p in run] for run in body["runs"]]
        seeds = (int(body["seeds"][0]), int(body["seeds"][1]))
        rows = int(body["rows"])
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise bad(f"its list of run files cannot be read: {e}") from e
    for run in runs:
        for p in run:
            if not names.is_run_file(p.name):
                raise bad(f"it names {p.name!r}, not a run file")
    return Manifest(runs, seeds, rows)


def is_manifest(tail: bytes) -> bool:
    """Whether a snapshot file whose last bytes are `tail` (its trailer at least) is a
    manifest, by its trailer's format alone (the manifest is checked whole when read)."""
    return (len(tail) >= TRAILER.size and tail[-TRAILER.size:][:8] == MAGIC
            and TRAILER.unpack(tail[-TRAILER.size:])[1] == FORMAT_MANIFEST)


def run_batches(where: str, context: str, manifest_path: str, piece: Piece,
                names: set[str], read: Callable[[str], bytes], schema: pa.Schema,
                decode) -> list[pa.RecordBatch]:
    """A run file's batches, all verified, and checked to be the one the manifest names.
    `decode(path, payload)` is the state's `decoding.decode`."""
    path = f"{where}/{piece.name}"
    if piece.name not in names:
        raise CorruptStateFile(path, context, f"it is missing: the snapshot {manifest_path} "
                               "names it")
    payload = read(piece.name)
    if len(payload) != piece.bytes:
        raise CorruptStateFile(path, context, f"it holds {len(payload)} bytes where the "
                               f"snapshot {manifest_path} names one of {piece.bytes}")
    try:
        batches, uid = decode(path, payload)
    except CorruptStateFile as e:
        raise CorruptStateFile(path, context, f"{e.what} (the snapshot {manifest_path} names "
                               "it)") from e
    if uid is None or uid.hex() != piece.uid:
        raise CorruptStateFile(path, context, f"it is not the run file the snapshot "
                               f"{manifest_path} names (its unique id differs)")
    if sum(b.num_rows for b in batches) != piece.rows:
        raise CorruptStateFile(path, context, f"it holds {sum(b.num_rows for b in batches)} "
                               f"entries where the snapshot {manifest_path} names "
                               f"{piece.rows}")
    return batches
