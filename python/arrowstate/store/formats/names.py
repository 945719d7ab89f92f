"""The names of a partition's state files: which name a version's delta or snapshot has, and
which kind of file a name is (ours, Spark's own state stores', or neither). Where a
version's file is found, and so what a load reads, starts here.

    <version>.arrowstate.delta      the puts and removes of one version (`files`)
    <version>.arrowstate.snapshot   every live row of one version, or a manifest (`manifest`)
    <version>_<id>.arrowstate.delta, <version>_<id>.arrowstate.snapshot
                                    the same under checkpoint format v2: `<id>` is the
                                    checkpoint id of the attempt that committed the version
                                    (`lineage`), so two attempts never write one name
    <32 hex>.arrowstate.schema      a columns file: the Arrow schema compact deltas name
                                    (`compact`; its suffix kept from when it was called a
                                    schema file, so checkpoints written before still load)
    <32 hex>.arrowstate.run         a piece of one of the tier's runs (`manifest`)
"""
from __future__ import annotations

import re
import uuid

from ...contract import FILES

DELTA, SNAPSHOT, RUN = "delta", "snapshot", "run"
SUFFIX = {DELTA: FILES["deltaSuffix"], SNAPSHOT: FILES["snapshotSuffix"]}
RUN_SUFFIX = FILES["runSuffix"]
COLUMNS_SUFFIX = FILES["schemaSuffix"]   # a columns file's (see `compact`)
_ID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_NAME = re.compile(r"^(\d+)(?:_(" + _ID + r"))?(" +
                   "|".join(re.escape(s) for s in SUFFIX.values()) + r")$")
_RUN_NAME = re.compile(r"^[0-9a-f]{32}" + re.escape(RUN_SUFFIX) + "$")
_COLUMNS_NAME = re.compile(r"^[0-9a-f]{32}" + re.escape(COLUMNS_SUFFIX) + "$")


def file_name(kind: str, version: int, checkpoint_id: str | None = None) -> str:
    """The name of a version's delta or snapshot: under checkpoint format v2 the one the
    attempt with `checkpoint_id` wrote."""
    if checkpoint_id is None:
        return f"{version}{SUFFIX[kind]}"
    return f"{version}_{checkpoint_id}{SUFFIX[kind]}"


def parse_name(name: str) -> tuple[int, str] | None:
    """(version, kind) of one of our delta or snapshot names (either format's), None for
    any other name."""
    m = _NAME.match(name)
    if m is None:
        return None
    return int(m.group(1)), DELTA if m.group(3) == SUFFIX[DELTA] else SNAPSHOT


def checkpoint_uid(checkpoint_id: str | None) -> bytes | None:
    """A checkpoint id (a UUID, checkpoint format v2) as a state file's unique id."""
    return None if checkpoint_id is None else uuid.UUID(checkpoint_id).bytes


def id_mismatch(name: str, uid: bytes | None) -> str | None:
    """What is wrong when a file whose name carries a checkpoint id has another unique id
    in its trailer (renamed, or another attempt's file); None when they agree."""
    named = checkpoint_id_of(name)
    if named is None or uid == checkpoint_uid(named):
        return None
    found = "none" if uid is None else uuid.UUID(bytes=uid)
    return (f"its trailer carries checkpoint id {found}, not the {named} its name says "
            "(renamed, or another attempt's file)")


def checkpoint_id_of(name: str) -> str | None:
    """The checkpoint id a delta's or snapshot's name carries (checkpoint format v2), None
    for format v1's names and any other name."""
    m = _NAME.match(name)
    return None if m is None else m.group(2)


def columns_file_name(columns_id: bytes) -> str:
    """The name of the columns file whose id (BLAKE2b-128 of its message) is `columns_id`."""
    return f"{columns_id.hex()}{COLUMNS_SUFFIX}"


def is_columns_file(name: str) -> bool:
    """Whether `name` is a columns file's (see `compact`)."""
    return _COLUMNS_NAME.match(name) is not None


def is_run_file(name: str) -> bool:
    """Whether `name` is a run file's (see `manifest`)."""
    return _RUN_NAME.match(name) is not None


def is_ours(name: str) -> bool:
    """Whether `name` is one of arrowstate's files (a version's delta or snapshot, a columns
    file or a run file)."""
    return parse_name(name) is not None or is_columns_file(name) or is_run_file(name)


def name_kind(name: str) -> tuple[int | None, str] | None:
    """(version, kind) of a state file's name (version None for a run file); None for any
    other name."""
    return (None, RUN) if is_run_file(name) else parse_name(name)


# Spark's own state stores' files: the HDFS-backed provider's and RocksDB's
SPARK_STORES = {
    "Spark's HDFS-backed state store (HDFSBackedStateStoreProvider)":
        re.compile(r"^(\d+)\.(delta|snapshot)$"),
    "Spark's RocksDB state store (RocksDBStateStoreProvider)":
        re.compile(r"^(\d+)(?:_[0-9a-f-]+)?\.(zip|changelog)$"),
}


def spark_store_files(names) -> dict[str, list[int]]:
    """The versions of Spark's own state store files among `names`, per store."""
    found = {store: sorted(int(m.group(1)) for m in map(pattern.match, names) if m)
             for store, pattern in SPARK_STORES.items()}
    return {store: versions for store, versions in found.items() if versions}
