"""Which files load a version: every chain of a partition's files (a snapshot at or below
the version, then each delta after it) that gives it, best first, and the error that names
what is missing when none does. `loading` applies a chain; the names are made in `formats.names`."""
from __future__ import annotations

from typing import Sequence

from ...errors import ArrowStateError
from ..formats.names import (DELTA, SNAPSHOT, checkpoint_id_of, file_name, parse_name,
                             spark_store_files)


class MissingStateFiles(ArrowStateError, FileNotFoundError):
    """No chain of files loads the version; the message names what is missing."""

    def __init__(self, condition: str, message: str, where: str) -> None:
        super().__init__(condition, message, path=where)


def load_plans(names: Sequence[str], version: int, where: str, context: str,
               snapshot: int | None = None) -> tuple[list[tuple[list[str], int]], list[int]]:
    """Every chain of files that, applied in order, gives `version`, best first: a snapshot
    at or below it (newest first; 0 for none) and the deltas after it; only the one from
    `snapshot` when that is given. Also every snapshot version present. Raises
    MissingStateFiles, naming what is missing, when none exists."""
    # format v1's names only: a file of an attempt's name (format v2) is read only on the
    # lineage the commit log names (`store.lineage`)
    present = [parse_name(n) for n in names
               if parse_name(n) is not None and checkpoint_id_of(n) is None]
    snapshots = sorted(v for v, kind in present if kind == SNAPSHOT)
    deltas = {v for v, kind in present if kind == DELTA}
    bases = [v for v in reversed(snapshots) if v <= version] + [0]
    if snapshot is not None:
        if snapshot not in snapshots or snapshot > version:
            raise MissingStateFiles(
                "CANNOT_LOAD_STATE_STORE.CANNOT_READ_MISSING_SNAPSHOT_FILE",
                f"An error occurred during loading state. arrowstate has no snapshot of "
                f"version {snapshot} in {where} ({context}): missing "
                f"{where}/{file_name(SNAPSHOT, snapshot)}", where)
        bases = [snapshot]
    plans = []
    for base in bases:
        if all(v in deltas for v in range(base + 1, version + 1)):
            chain = [file_name(SNAPSHOT, base)] if base else []
            chain += [file_name(DELTA, v) for v in range(base + 1, version + 1)]
            plans.append((chain, base))
    if not plans:
        spark_files = spark_store_files(names)
        if spark_files and not present:
            stores = "; ".join(f"{store}, versions {versions[0]} to {versions[-1]}"
                               for store, versions in spark_files.items())
            raise MissingStateFiles(
                "CANNOT_LOAD_STATE_STORE.CANNOT_READ_DELTA_FILE_NOT_EXISTS",
                f"An error occurred during loading state. arrowstate cannot load state version "
                f"{version} of {where} ({context}): this state was written by {stores}, not "
                f"by arrowstate, and was not converted (arrowstate operators adopt it on "
                f"their first load; `python -m arrowstate state import` converts it "
                f"offline). Or run this operator on Spark's own (spark.arrowstate.enabled="
                f"false) to continue it.", where)
        missing = [v for v in range(bases[0] + 1, version + 1) if v not in deltas]
        if any(checkpoint_id_of(n) is not None and parse_name(n)[0] in missing
               for n in names):
            raise MissingStateFiles(
                "CANNOT_LOAD_STATE_STORE.CANNOT_READ_DELTA_FILE_NOT_EXISTS",
                f"An error occurred during loading state. arrowstate cannot load state version "
                f"{version} of {where} ({context}) without the checkpoint ids Spark's commit "
                f"log records for it: its files were written under checkpoint format v2 "
                f"(their names carry the id of the attempt that wrote each). Continue the "
                f"query with spark.sql.streaming.stateStore.checkpointFormatVersion=2.", where)
        raise MissingStateFiles(
            "CANNOT_LOAD_STATE_STORE.CANNOT_READ_DELTA_FILE_NOT_EXISTS",
            f"An error occurred during loading state. arrowstate cannot load state version "
            f"{version} of "
            f"{where} ({context}): no snapshot at or below it is followed by every delta; "
            f"missing " + ", ".join(f"{where}/{file_name(DELTA, v)}"
                                    for v in missing), where)
    return plans, snapshots
