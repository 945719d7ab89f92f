"""Checkpoint format v2's lineage: which attempt's files a version is.

Under `spark.sql.streaming.stateStore.checkpointFormatVersion=2` (which real-time mode
sets) every task attempt has a checkpoint id, and Spark's commit log records, per operator
and partition, the id of the attempt whose version counts. Every file an attempt writes for
a version carries that id in its name (`<version>_<id>.arrowstate.delta`, and
`.arrowstate.snapshot` for the snapshot of that version: `formats.names`) and as its unique
id, and a delta records the id of the version it was built on (`formats.container`'s
FLAG_BASE). No two attempts write one name, and no write replaces a file: a speculative or
zombie attempt, or a stage run again, leaves files of its own beside the committed ones.

A load starts from the id the commit log names for its version and follows the links back
to a snapshot of the same lineage (`lineage_plans`), never reading a file whose id the
lineage does not name; the files other attempts left go with retention (`lifecycle.
maintenance`). A state a worker holds from its last task is taken again only when its id
is the one the commit log names (`held.states`). Checkpoints written under format v1, or
by an arrowstate before per-attempt names (one name per version, the id in the trailer
only), load by format v1's chains (`lifecycle.chains`) from where their names begin.
"""
from __future__ import annotations

import uuid
from typing import Any, Iterator, Sequence

from ..errors import ArrowStateError
from .formats.container import TRAILER, base_id, unique_id
from .formats.names import DELTA, SNAPSHOT, checkpoint_uid, file_name
from .lifecycle.chains import MissingStateFiles, load_plans
from .lifecycle.sources import FileSource

Plan = tuple[list[str], int]   # a chain of files, applied in order, and its base version


def lineage_plans(source: FileSource, names: Sequence[str], version: int,
                  checkpoint_id: str, snapshot: int | None = None
                  ) -> Iterator[tuple[list[str], int, dict[int, str]]]:
    """The chains of files that give `version` as the attempt `checkpoint_id` committed it,
    best first, made as they are asked for: each step back reads one delta's last bytes for
    the id of the version it builds on. From `<version>_<id>` the walk goes back to a
    snapshot of the lineage, to version 0, or to a version of format v1's names, where
    format v1's chains take over. With `snapshot`, only the chain from that snapshot
    (Spark's readers' snapshotStartBatchId). Yields (chain, base version, the lineage's
    snapshots met so far: version -> name). MissingStateFiles names the first file the
    lineage needs that is not there, when no chain was found before it."""
    present = set(names)
    deltas: list[str] = []   # the lineage's deltas met so far, newest first
    snapshots: dict[int, str] = {}
    v, cid = version, checkpoint_id
    while v > 0 and cid is not None:
        snap = file_name(SNAPSHOT, v, cid)
        if snap in present and snapshot in (None, v):
            snapshots[v] = snap
            yield [snap] + deltas[::-1], v, dict(snapshots)
        if snapshot is not None and v <= snapshot:
            if snap not in present:
                raise MissingStateFiles(
                    "CANNOT_LOAD_STATE_STORE.CANNOT_READ_MISSING_SNAPSHOT_FILE",
                    f"An error occurred during loading state. arrowstate has no snapshot of "
                    f"version {snapshot} on the lineage of version {version} (checkpoint id "
                    f"{checkpoint_id}) in {source.where} ({source.context}): missing "
                    f"{source.where}/{snap}", source.where)
            return
        delta = file_name(DELTA, v, cid)
        if delta not in present:
            older = file_name(DELTA, v)
            if older in present:   # format v1's name, written under v2 by an older arrowstate
                _check_v1_delta(source, older, v, cid)
                break
            if snapshots:
                return   # retention pruned the lineage below the snapshots found
            raise MissingStateFiles(
                "CANNOT_LOAD_STATE_STORE.CANNOT_READ_DELTA_FILE_NOT_EXISTS",
                f"An error occurred during loading state. arrowstate cannot load state version "
                f"{version} (checkpoint id {checkpoint_id}) of {source.where} "
                f"({source.context}): its lineage needs version {v} with checkpoint id {cid}; "
                f"missing {source.where}/{delta}", source.where)
        deltas.append(delta)
        cid = recorded_base(source, delta)
        v -= 1
    if v == 0:
        if snapshot is None:
            yield deltas[::-1], 0, dict(snapshots)
            return
        raise MissingStateFiles(
            "CANNOT_LOAD_STATE_STORE.CANNOT_READ_MISSING_SNAPSHOT_FILE",
            f"An error occurred during loading state. arrowstate has no snapshot of version "
            f"{snapshot} on the lineage of version {version} (checkpoint id {checkpoint_id}) "
            f"in {source.where} ({source.context})", source.where)
    # below here, format v1's names
    plans, older_snapshots = load_plans(names, v, source.where, source.context, snapshot)
    known = dict(snapshots)
    known.update((s, file_name(SNAPSHOT, s)) for s in older_snapshots)
    for chain, base in plans:
        yield chain + deltas[::-1], base, known


def recorded_base(source: FileSource, delta: str) -> str | None:
    """The checkpoint id of the version a delta was built on (None: the version before it
    has format v1's names, or it is version 1), from the delta's last bytes; the whole
    file's checksum vouches for it when the load reads it (`lifecycle.loading`)."""
    base = base_id(f"{source.where}/{delta}", source.context,
                   source.tail(delta, TRAILER.size + 16))
    return None if base is None else str(uuid.UUID(bytes=base))


def _check_v1_delta(source: FileSource, name: str, version: int, cid: str) -> None:
    """A delta of format v1's name on a v2 lineage (written under v2 by an arrowstate before
    per-attempt names): its unique id must be the one the lineage names."""
    found = unique_id(source.tail(name, TRAILER.size))
    if found == checkpoint_uid(cid):
        return
    found_id = "none" if found is None else str(uuid.UUID(bytes=found))
    raise ArrowStateError(
        "CANNOT_LOAD_STATE_STORE.INVALID_CHECKPOINT_LINEAGE",
        f"An error occurred during loading state. Invalid checkpoint lineage: version "
        f"{version} id {cid}. {source.where}/{name} ({source.context}) has checkpoint id "
        f"{found_id}, and no {file_name(DELTA, version, cid)} is there: an arrowstate "
        "before per-attempt file names let an attempt whose batch did not commit write over "
        "the version's file.",
        lineage=f"{version}:{cid}", message=f"{name} has checkpoint id {found_id}")


def committed_base(state: Any, base_id: str | None) -> bool:
    """Whether a held state is the version the commit log names (`base_id`, its attempt's
    checkpoint id; None, outside checkpoint format v2: nothing to check)."""
    return base_id is None or state.checkpoint_id == base_id


def committed_here(state: Any, files: FileSource) -> bool:
    """Whether the checkpoint's delta of a held state's version is still the one this state
    committed. Under format v2 its name is the attempt's own, so it is (once the commit log
    names that attempt: `held.states`); under format v1 another attempt or executor may have
    written over it since (speculative tasks): one small read of that file's trailer."""
    if state.version == 0 or state.checkpoint_id is not None:
        return True
    found = unique_id(files.tail(file_name(DELTA, state.version), TRAILER.size))
    return state.last_uid is not None and found == state.last_uid


def lineage_deltas(source: FileSource, names: Sequence[str], version: int,
                   checkpoint_id: str | None, start: int) -> dict[int, str]:
    """The name of the delta of each version from `start` to `version` on the lineage of
    `checkpoint_id` (format v1's names without one, and below where the lineage's names
    end), for a change feed; a version whose delta is missing is named as the lineage would
    have it and ends the walk (the caller says it is missing)."""
    present, found = set(names), {}
    v, cid = version, checkpoint_id
    while v >= max(start, 1):
        name = file_name(DELTA, v, cid)
        if cid is not None and name not in present and file_name(DELTA, v) in present:
            _check_v1_delta(source, file_name(DELTA, v), v, cid)
            cid = None
            continue
        found[v] = name
        if name not in present:
            break
        if cid is not None:
            cid = recorded_base(source, name)
        v -= 1
    return found
