"""The lifecycle of one partition's files: which files load a version, when a snapshot is
made, and which files retention lets go. The JVM only lists, reads, writes and deletes what
this decides; snapshots are encoded here in a thread and written, like the pruning, by the
shim's maintenance thread, both off the micro-batch's path (as Spark's maintenance does). A
worker writes a snapshot to a local file a batch at a time and the JVM copies it into the
checkpoint, so a large snapshot is never whole in memory; without a directory (offline
tools, tests) it is encoded to bytes. A state on the tier snapshots as a manifest naming
its runs' files (`manifest`): only runs no earlier snapshot shipped are written, and a run
file goes when no snapshot that retention keeps names it.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import uuid
from typing import Callable, NamedTuple, Protocol, Sequence

from ..errors import ArrowStateError
from . import files, manifest
from .runs import RunFiles


class FileSource(Protocol):
    """The files of one partition's directory, as the JVM serves them."""

    where: str     # the directory, as errors name it
    context: str   # operator, partition and version, as errors name them

    def names(self) -> list[str]: ...

    def read(self, name: str) -> bytes | memoryview:
        """The file's bytes: a large one as a memoryview of a memory-mapped local copy
        (`files` decodes either)."""

    def tail(self, name: str, size: int) -> bytes:
        """The file's last `size` bytes (all of a shorter one); empty if it is missing."""


def schema_reader(source: FileSource, names: Sequence[str]) -> Callable[[str], bytes | None]:
    """For `files.decode`: a schema file of the directory (whose files are `names`) by
    name, read once however many deltas name it; None for one it does not hold."""
    present, read = set(names), {}

    def schema(name: str) -> bytes | None:
        if name not in present:
            return None
        if name not in read:
            read[name] = bytes(source.read(name))
        return read[name]
    return schema


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
    present = [parsed for parsed in map(files.parse_name, names) if parsed is not None]
    snapshots = sorted(v for v, kind in present if kind == files.SNAPSHOT)
    deltas = {v for v, kind in present if kind == files.DELTA}
    bases = [v for v in reversed(snapshots) if v <= version] + [0]
    if snapshot is not None:
        if snapshot not in snapshots or snapshot > version:
            raise MissingStateFiles(
                "CANNOT_LOAD_STATE_STORE.CANNOT_READ_MISSING_SNAPSHOT_FILE",
                f"An error occurred during loading state. arrowstate has no snapshot of "
                f"version {snapshot} in {where} ({context}): missing "
                f"{where}/{files.file_name(files.SNAPSHOT, snapshot)}", where)
        bases = [snapshot]
    plans = []
    for base in bases:
        if all(v in deltas for v in range(base + 1, version + 1)):
            chain = [files.file_name(files.SNAPSHOT, base)] if base else []
            chain += [files.file_name(files.DELTA, v) for v in range(base + 1, version + 1)]
            plans.append((chain, base))
    if not plans:
        spark_files = files.spark_store_files(names)
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
        raise MissingStateFiles(
            "CANNOT_LOAD_STATE_STORE.CANNOT_READ_DELTA_FILE_NOT_EXISTS",
            f"An error occurred during loading state. arrowstate cannot load state version "
            f"{version} of "
            f"{where} ({context}): no snapshot at or below it is followed by every delta; "
            f"missing " + ", ".join(f"{where}/{files.file_name(files.DELTA, v)}"
                                    for v in missing), where)
    return plans, snapshots


SHIP_MIN_BYTES = 4 << 20   # a commit ships at least this much of a snapshot's files


class Lifecycle:
    """Snapshot scheduling and retention for one partition."""

    def __init__(self) -> None:
        self.snapshots: set[int] = set()      # versions with a snapshot written or shipped
        self.last_snapshot_version = 0        # the newest snapshot made or loaded
        self.pruned_below = 0
        # the run files each known manifest names (those shipped, or read at the load)
        self.manifests: dict[int, frozenset[str]] = {}
        self._pending: _Snapshot | None = None
        # a finished snapshot shipping over commits: it, what it made, the files left, and
        # the bytes a commit ships of them
        self._shipping: tuple[_Snapshot, Made, list, int] | None = None
        self._spread = 1   # the commits a snapshot's files may ship over (see maintenance)

    def loaded(self, snapshots: Sequence[int], base: int, damaged: Sequence[int],
               manifests: dict[int, frozenset[str]]) -> None:
        """After a load from `base`: a damaged snapshot is never counted on for pruning.
        `manifests`: the run files of every manifest the partition holds."""
        self.snapshots = set(snapshots) - set(damaged)
        self.last_snapshot_version = base
        self.manifests = dict(manifests)

    def committed(self, rows_of, schema, version: int, min_deltas_for_snapshot: int,
                  directory: str | None = None, codec: str = "lz4",
                  seeds: tuple[int, int] = (0, 0)) -> None:
        """After `version` is committed: makes its snapshot in a thread when one is due (in
        files in `directory`, else as bytes; compressed with `codec`). `rows_of` is called
        only then (it freezes the live rows); a tier's frozen runs make a manifest, whose
        keys follow the hash `seeds`."""
        self._spread = max(1, min_deltas_for_snapshot)
        due = version - self.last_snapshot_version >= self._spread
        if due and self._pending is None and self._shipping is None:
            self._pending = _Snapshot(rows_of(), schema, version, directory, codec, seeds)
            self.last_snapshot_version = version

    def discard(self) -> None:
        """The state is dropped: a snapshot made but not shipped is deleted."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.join()
            pending.delete_local()
        shipping, self._shipping = self._shipping, None
        if shipping is not None:
            _delete_local(shipping[2])

    def maintenance(self, new_version: int, min_versions_to_retain: int,
                    list_names: Callable[[], list[str]] | None = None,
                    held_runs: Callable[[], set[str]] = set,
                    delta_bytes: int = 0) -> "Maintenance":
        """What to write and prune with the commit of `new_version`: files of a finished
        snapshot, in order; the version below which files may go (-1 for none): the
        newest snapshot at or below the oldest version retention keeps loadable; and the
        run files to delete then, named by no snapshot kept nor by the state's runs
        (`held_runs`). The JVM prunes only after the snapshots are written and once that
        snapshot's file exists, and deletes the run files only after it pruned.

        A snapshot's files ship over the commits until the next is due
        (`min_deltas_for_snapshot`), each commit about an even share of them, or as much
        as its delta (`delta_bytes`) or SHIP_MIN_BYTES where that is more, its manifest
        last: no micro-batch writes a whole snapshot. A manifest naming run files of earlier
        snapshots ships only when `list_names` (the partition's files) shows them all
        there: one whose write failed leaves its runs to be written again by the next."""
        if (self._shipping is None and self._pending is not None
                and not self._pending.is_alive()):
            pending, self._pending = self._pending, None
            try:
                made = pending.result()
            except OSError as e:   # a local disk that is full: the deltas stay, as in Spark
                print(f"arrowstate: WARN the snapshot of version {pending.version} could not "
                      f"be written to {pending.directory}: {e}; its deltas stay, nothing is "
                      "lost", file=sys.stderr, flush=True)
            else:
                if self._may_ship(pending, made, list_names):
                    share = -(-sum(_size(c) for _, c in made.files) // self._spread)
                    self._shipping = (pending, made, list(made.files), share)
        shipped = self._installment(delta_bytes)
        oldest_retained = new_version - min_versions_to_retain + 1
        base = max((v for v in self.snapshots if v <= oldest_retained), default=0)
        if base <= self.pruned_below:
            return Maintenance(shipped, -1, [])
        self.pruned_below = base
        kept = set(held_runs())
        for snapshot in (self._pending, self._shipping and self._shipping[0]):
            if snapshot:
                kept |= snapshot.reused
        gone: set[str] = set()
        for version in list(self.manifests):
            if version < base:
                gone |= self.manifests.pop(version)
        for names in self.manifests.values():
            kept |= names
        return Maintenance(shipped, base, sorted(gone - kept))

    def _may_ship(self, pending: "_Snapshot", made: "Made",
                  list_names: Callable[[], list[str]] | None) -> bool:
        """Whether a finished snapshot may ship: a manifest's earlier run files are there."""
        if made.written is None or not made.written.reused or list_names is None:
            return True
        missing = sorted(made.written.reused - set(list_names()))
        if not missing:
            return True
        print(f"arrowstate: WARN the snapshot of version {pending.version} is not written: "
              f"run files it names from earlier snapshots are missing ({', '.join(missing)});"
              " the next snapshot writes those runs again, and the deltas stay, nothing is "
              "lost", file=sys.stderr, flush=True)
        for cell in pending.reused_cells:
            if cell.pieces is not None and any(p.name in missing for p in cell.pieces):
                cell.pieces = None
        pending.delete_local()
        return False

    def _installment(self, delta_bytes: int) -> list[tuple[str, bytes | str]]:
        """The next files of the snapshot shipping (see `maintenance`): at least one, and
        more while they stay within the commit's share. With its last (its manifest or
        snapshot file) it is written: a manifest's runs are marked as in the checkpoint."""
        if self._shipping is None:
            return []
        pending, made, left, share = self._shipping
        budget = max(SHIP_MIN_BYTES, delta_bytes, share)
        out, size = [], 0
        while left and (not out or size + _size(left[0][1]) <= budget):
            size += _size(left[0][1])
            out.append(left.pop(0))
        if not left:
            self._shipping = None
            if made.written is not None:
                for cell, pieces in made.written.new_runs:
                    cell.pieces = pieces
                self.manifests[pending.version] = frozenset(made.written.manifest.names())
            self.snapshots.add(pending.version)
        return out

    def wait_for_snapshot(self) -> None:
        if self._pending is not None:
            self._pending.join()


def _size(content: bytes | str) -> int:
    return len(content) if not isinstance(content, str) else os.path.getsize(content)


def _delete_local(entries: list[tuple[str, bytes | str]]) -> None:
    for _, content in entries:
        if isinstance(content, str):
            with contextlib.suppress(FileNotFoundError):
                os.remove(content)


class Maintenance(NamedTuple):
    snapshots: list      # (name, bytes or local path) to write, in order
    prune_below: int
    delete: list[str]    # run files to delete once pruned


class Made(NamedTuple):
    """A finished snapshot: its files in order, and for a manifest what it wrote."""
    files: list[tuple[str, bytes | str]]
    written: manifest.Written | None


class _Snapshot(threading.Thread):
    """Encodes a snapshot of one committed version, to local files in `directory` (their
    paths are the result) or to bytes: every live row, or for a tier a manifest and the
    runs not written before; Arrow's take and IPC release the GIL."""

    def __init__(self, rows, schema, version: int, directory: str | None, codec: str,
                 seeds: tuple[int, int]) -> None:
        super().__init__(name=f"arrowstate-snapshot-{version}", daemon=True)
        self.version, self.directory, self._codec, self._seeds = version, directory, codec, seeds
        self._rows, self._schema = rows, schema
        runs = rows.runs() if hasattr(rows, "runs") else ()
        # the runs' cells for their checkpoint files (`RunFiles`), made here, in the task's
        # thread, before a run can be copied; the snapshot holds them, never the runs
        for run, _ in runs:
            if run.files is None:
                run.files = RunFiles()
        # the runs it names from earlier snapshots: retention keeps their files meanwhile
        self.reused_cells = [run.files for run, _ in runs if run.pieces is not None]
        self.reused = {p.name for cell in self.reused_cells for p in cell.pieces}
        self._made: Made | None = None
        self._local: list[str] = []
        self._error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            if self.directory is not None:
                os.makedirs(self.directory, exist_ok=True)
            if hasattr(self._rows, "runs"):
                written = manifest.write(self._rows.runs(), self._schema, self.version,
                                         self._seeds, self._rows.live, self.directory,
                                         self._codec)
                self._made = Made(written.files, written)
            else:
                self._made = Made([self._rows_file()], None)
            self._local = [c for _, c in self._made.files if isinstance(c, str)]
        except BaseException as e:  # surfaced by result(), in the task that ships it
            self._error = e
        finally:
            if hasattr(self._rows, "close"):
                self._rows.close()
            self._rows = None

    def _rows_file(self) -> tuple[str, bytes | str]:
        name = files.file_name(files.SNAPSHOT, self.version)
        rows = (files.with_op(b, files.OP_PUT) for b in self._rows.batches(1 << 16))
        if self.directory is None:
            data, _ = files.encode(self._schema, files.SNAPSHOT, self.version, rows,
                                   codec=self._codec)
            return name, data
        path = os.path.join(self.directory, f"{uuid.uuid4().hex}-{name}")
        try:
            files.encode_to_file(path, self._schema, files.SNAPSHOT, self.version, rows,
                                 self._codec)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
            raise
        return name, path

    def result(self) -> Made:
        self.join()
        if self._error is not None:
            raise self._error
        return self._made

    def delete_local(self) -> None:
        """Deletes the local files it made (a snapshot not shipped)."""
        _delete_local([("", path) for path in self._local])
        self._local = []
