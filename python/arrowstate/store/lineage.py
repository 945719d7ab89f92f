"""Checkpoint format v2's lineage of a partition's state: each version's delta carries, as
its unique id, the checkpoint id Spark's commit log records for that version's batch, so a
load (or a state held from the last task) can tell the delta the commit log names from one
a task attempt whose batch never committed wrote over it. Reading a delta's id
(`delta_uid`: one small ranged read of its trailer), whether a held state committed the
delta the commit log names (`committed_base`) and is still the one in the checkpoint
(`committed_here`), and the check that fails a load on another (`check_lineage`) are here; where a version's files are named is `formats.names`, which
files load a version `lifecycle.chains`.
"""
from __future__ import annotations

import uuid

from ..errors import ArrowStateError
from .formats.container import TRAILER, unique_id
from .formats.names import DELTA, file_name
from .lifecycle.sources import FileSource
from .versions.versioned import VersionedState


def checkpoint_uid(checkpoint_id: str | None) -> bytes | None:
    """A checkpoint id (a UUID, checkpoint format v2) as a state file's unique id."""
    return None if checkpoint_id is None else uuid.UUID(checkpoint_id).bytes


def delta_uid(version: int, files: FileSource) -> bytes | None:
    """The unique id in the trailer of the version's delta (one small ranged read)."""
    return unique_id(files.tail(file_name(DELTA, version), TRAILER.size))


def committed_base(state: VersionedState, base_id: str | None) -> bool:
    """Whether the state committed the delta Spark's commit log names for its version
    (`base_id`; None, outside checkpoint format v2: nothing to check)."""
    return base_id is None or state.last_uid == checkpoint_uid(base_id)


def committed_here(state: VersionedState, files: FileSource) -> bool:
    """Whether the checkpoint's newest delta of the state's version is the one this state
    committed (the idea of Spark's checkpoint format v2): another attempt or executor may
    have rewritten it since. One small read of that file's trailer."""
    if state.version == 0:
        return True
    return state.last_uid is not None and delta_uid(state.version, files) == state.last_uid


def check_lineage(state: VersionedState, files: FileSource, base_id: str | None) -> None:
    """Under checkpoint format v2, fails the load when the state's version is not the one
    Spark's commit log recorded (`base_id`): its delta was rewritten by an attempt whose
    batch did not commit, and loading it would be silently wrong."""
    if base_id is None or state.version == 0:
        return
    # the state's own id when its load ended on the delta, else (on a snapshot) the delta's
    found = state.last_uid or delta_uid(state.version, files)
    if found == checkpoint_uid(base_id):
        return
    name = file_name(DELTA, state.version)
    found_id = "none" if found is None else str(uuid.UUID(bytes=found))
    raise ArrowStateError(
        "CANNOT_LOAD_STATE_STORE.INVALID_CHECKPOINT_LINEAGE",
        f"An error occurred during loading state. Invalid checkpoint lineage: version "
        f"{state.version} id {base_id}. {files.where}/{name} ({files.context}) has checkpoint id "
        f"{found_id}, not the id {base_id} that the commit log recorded for version "
        f"{state.version}: the file was written by a task attempt whose batch did not commit. "
        "Restart the query from a checkpoint copy taken before that batch, or from a new "
        "checkpoint location.",
        **{"lineage": f"{state.version}:{base_id}",
           "message": f"{name} has checkpoint id {found_id}"})
