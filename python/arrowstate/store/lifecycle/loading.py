"""Loading a version into a partition's state: the first chain of files (`chains`) whose
files are all sound, applied in order (a snapshot, or a manifest and its run files, then
the deltas after it), every file verified whole before it is applied (`formats.decoding`).
A damaged snapshot is passed over, with a warning naming it, for an older one (or none) and
the deltas after that, as Spark's automatic snapshot repair does; a damaged or missing
delta that every chain needs fails, naming it."""
from __future__ import annotations

import contextlib
import sys
import uuid
from typing import NamedTuple, Sequence

import pyarrow as pa

from ..formats import decoding, files, manifest
from .. import lineage
from ..formats.container import TRAILER, CorruptStateFile, base_id
from ..formats.names import (DELTA, SNAPSHOT, SUFFIX, checkpoint_id_of, checkpoint_uid,
                             file_name, is_columns_file, is_run_file)
from ..tier.tiered import TieredRows
from .chains import load_plans
from .sources import FileSource, columns_reader


class Loaded(NamedTuple):
    """What a load found: the unique id of the delta it ended on (None when it ended on a
    snapshot), the damaged snapshots it passed over, and the partition's columns files."""
    last_uid: bytes | None
    files_skipped: int
    columns_files: set[str]


def load_version(state, source: FileSource, version: int, snapshot: int | None = None,
                 checkpoint_id: str | None = None) -> Loaded:
    """Loads `version` into `state` (a `versions.versioned.VersionedState`, its rows cleared
    before each chain is tried). With `snapshot`, only the chain from that snapshot is taken
    (Spark's readers' snapshotStartBatchId). With `checkpoint_id` (checkpoint format v2),
    only the files of that attempt's lineage (`store.lineage`), each delta's link to the
    file before it checked once the delta is verified whole."""
    names = source.names()
    if checkpoint_id is None:
        plans, found = load_plans(names, version, source.where, source.context, snapshot)
        known = {v: file_name(SNAPSHOT, v) for v in found}
        chains = ((chain, base, known) for chain, base in plans)
    else:
        chains = lineage.lineage_plans(source, names, version, checkpoint_id, snapshot)
    damaged: list[int] = []
    read_columns = columns_reader(source, names)

    def decoded(name: str, after: str | None = None
                ) -> tuple[list[pa.RecordBatch], bytes | None]:
        path, payload = f"{source.where}/{name}", source.read(name)
        result = decoding.decode(path, source.context, payload, state.schema,
                                 state.dropped_columns, state.evolve, read_columns)
        # its link, under the checksum just checked (one to a file of format v1's name the
        # walk checked by that file's unique id)
        if checkpoint_id_of(name) is not None and (
                after is None or checkpoint_id_of(after) is not None):
            expected = None if after is None else checkpoint_id_of(after)
            found = base_id(path, source.context, payload)
            if found != checkpoint_uid(expected):
                raise CorruptStateFile(path, source.context, (
                    f"it records the version before it as checkpoint id "
                    f"{uuid.UUID(bytes=found) if found else 'none'}, not {expected}"))
        return result

    # a tier merges whole as it loads (no micro-batches to pace its merges over)
    with (state.rows.merges.unpaced() if isinstance(state.rows, TieredRows)
          else contextlib.nullcontext()):
        for chain, base, snapshots in chains:
            state.rows.clear()
            try:
                uid = _load_base(state, source, chain[0], names, decoded)
            except CorruptStateFile as e:
                if not base:
                    raise
                damaged.append(base)
                last_damage = e
                print(f"arrowstate: WARN skipping damaged snapshot {e.path} "
                      f"({source.context}): {e.what}; loading from an older snapshot and "
                      "the deltas after it", file=sys.stderr, flush=True)
                continue
            for before, name in zip(chain, chain[1:]):   # each verified whole, then applied
                batches, uid = decoded(name, before)
                for batch in batches:
                    replay(state, batch)
            state.lifecycle.loaded(snapshots, base, damaged,
                                   _manifests(source, names, snapshots, damaged))
            return Loaded(uid if chain[-1].endswith(SUFFIX[DELTA]) else None, len(damaged),
                          {n for n in names if is_columns_file(n)})
    raise CorruptStateFile(
        last_damage.path, source.context,
        f"{last_damage.what}; every snapshot that could load version {version} is damaged "
        f"({', '.join(map(str, damaged))}) and no chain of deltas alone reaches it")


def _load_base(state, source: FileSource, name: str, names: list[str],
               decoded) -> bytes | None:
    """Applies the first file of a load's chain (a snapshot, a manifest and its run files,
    or the first delta); its unique id (None for a manifest)."""
    payload = source.read(name)
    path = f"{source.where}/{name}"
    made = (manifest.read(path, source.context, payload)
            if name.endswith(SUFFIX[SNAPSHOT]) else None)
    if made is None:
        batches, uid = decoded(name)
        for batch in batches:
            replay(state, batch)
        return uid
    present = set(names)

    def run_batches(piece: manifest.Piece) -> list[pa.RecordBatch]:
        return manifest.run_batches(
            source.where, source.context, path, piece, present, source.read, state.schema,
            lambda p, data: decoding.decode(p, source.context, data, state.schema,
                                            state.dropped_columns, state.evolve))

    if not isinstance(state.rows, TieredRows):   # state in memory: the runs in order
        for run in made.runs:
            for piece in run:
                for batch in run_batches(piece):
                    replay(state, batch)
        return None
    state.seeds = made.seeds   # the runs' key order follows the seeds that wrote them

    def entries(run: list[manifest.Piece]):
        for piece in run:
            for batch in run_batches(piece):
                rows = pa.RecordBatch.from_arrays(batch.columns[:-1], schema=state.schema)
                alive = batch.column(batch.num_columns - 1).to_numpy(
                    zero_copy_only=False) == files.OP_PUT
                yield (state.keys(rows.columns[: state.key_count], rows.num_rows), alive,
                       rows)

    for run in made.runs:
        state.rows.adopt(entries(run), sum(p.rows for p in run), tuple(run),
                         lambda what: CorruptStateFile(
                             f"{source.where}/{run[0].name}", source.context, what))
    state.rows.set_live(made.rows)
    return None


def _manifests(source: FileSource, names: list[str], snapshots: dict[int, str],
               damaged: Sequence[int]) -> dict[int, frozenset[str]]:
    """The run files every manifest of the partition names (retention deletes a run file
    only when no snapshot it keeps names it). A snapshot's last bytes say whether it is
    one; a damaged manifest is passed over (it loads nothing: its run files need not stay
    for it)."""
    found: dict[int, frozenset[str]] = {}
    if not any(is_run_file(n) for n in names):
        return found
    for version, name in snapshots.items():
        if version in damaged:
            continue
        if not manifest.is_manifest(source.tail(name, TRAILER.size)):
            continue
        try:
            made = manifest.read(f"{source.where}/{name}", source.context, source.read(name))
        except CorruptStateFile:
            continue
        if made is not None:
            found[version] = frozenset(made.names())
    return found


def replay(state, batch: pa.RecordBatch) -> None:
    """Replays a file batch on the state's rows: runs of puts and removes, in order (change
    records are no state)."""
    for op, run in files.op_runs(batch):
        if op not in (files.OP_PUT, files.OP_REMOVE):
            continue
        run = pa.RecordBatch.from_arrays(run.columns[:-1], schema=state.schema)
        run_keys = state.keys(run.columns[: state.key_count], run.num_rows)
        if op == files.OP_PUT:
            state.rows.insert(run_keys, run)
        else:
            state.rows.discard(run_keys, run)
