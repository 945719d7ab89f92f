"""What each commit of one partition writes and prunes besides its delta: when a snapshot
is made (`snapshots` encodes it), how its files ship over the commits until the next is
due, and which files retention lets go (the version below which they may be pruned, and the
run files no snapshot kept names). The JVM only lists, reads, writes and deletes what this
decides; snapshots are written, like the pruning, by the shim's maintenance thread, off the
micro-batch's path (as Spark's maintenance does). A state on the tier snapshots as a
manifest naming its runs' files (`formats.manifest`): only runs no earlier snapshot shipped
are written, and a run file goes when no snapshot that retention keeps names it.
"""
from __future__ import annotations

import os
import sys
from typing import Callable, NamedTuple, Sequence

from ..formats.names import is_run_file
from .snapshots import Made, Snapshot, delete_local

SHIP_MIN_BYTES = 4 << 20   # a commit ships at least this much of a snapshot's files


class Lifecycle:
    """Snapshot scheduling and retention for one partition."""

    def __init__(self) -> None:
        # versions with a snapshot written or shipped, by the snapshot file's name (under
        # checkpoint format v2 it carries the version's checkpoint id)
        self.snapshots: dict[int, str] = {}
        self.last_snapshot_version = 0        # the newest snapshot made or loaded
        self.pruned_below = 0
        # the run files each known manifest names (those shipped, or read at the load)
        self.manifests: dict[int, frozenset[str]] = {}
        self._pending: Snapshot | None = None
        # a finished snapshot shipping over commits: it, what it made, the files left, and
        # the bytes a commit ships of them
        self._shipping: tuple[Snapshot, Made, list, int] | None = None
        self._spread = 1   # the commits a snapshot's files may ship over (see maintenance)

    def loaded(self, snapshots: dict[int, str], base: int, damaged: Sequence[int],
               manifests: dict[int, frozenset[str]]) -> None:
        """After a load from `base`: the snapshots the load may count on (version -> file
        name; under checkpoint format v2 those of the loaded version's lineage); a damaged
        one never is. `manifests`: the run files each of those that is a manifest names."""
        self.snapshots = {v: n for v, n in snapshots.items() if v not in set(damaged)}
        self.last_snapshot_version = base
        self.manifests = dict(manifests)

    def committed(self, rows_of, schema, version: int, min_deltas_for_snapshot: int,
                  directory: str | None = None, codec: str = "lz4",
                  seeds: tuple[int, int] = (0, 0), checkpoint_id: str | None = None,
                  threaded: Callable[[], bool] = lambda: True) -> None:
        """After `version` is committed: makes its snapshot when one is due (in files in
        `directory`, else as bytes; compressed with `codec`), in a thread when `threaded()`
        says so, else when `make_waiting_snapshot` is called. `rows_of` and `threaded` are
        called only then (`rows_of` freezes the live rows); a tier's frozen runs make a
        manifest, whose keys follow the hash `seeds`. `checkpoint_id`: the version's, under
        checkpoint format v2 (the snapshot's name carries it)."""
        self._spread = max(1, min_deltas_for_snapshot)
        due = version - self.last_snapshot_version >= self._spread
        if due and self._pending is None and self._shipping is None:
            self._pending = Snapshot(rows_of(), schema, version, directory, codec, seeds,
                                     checkpoint_id, threaded())
            self.last_snapshot_version = version

    def snapshot_waits(self) -> bool:
        """Whether an unthreaded snapshot is due to be made."""
        return self._pending is not None and self._pending.waits()

    def make_waiting_snapshot(self) -> None:
        if self.snapshot_waits():
            self._pending.make()

    def discard(self) -> None:
        """The state is dropped: a snapshot made but not shipped is deleted."""
        pending, self._pending = self._pending, None
        if pending is not None and not pending.waits():   # (one that waits made nothing)
            pending.make()
            pending.delete_local()
        shipping, self._shipping = self._shipping, None
        if shipping is not None:
            delete_local(shipping[2])

    def maintenance(self, new_version: int, min_versions_to_retain: int,
                    list_names: Callable[[], list[str]] | None = None,
                    held_runs: Callable[[], set[str]] = set,
                    delta_bytes: int = 0) -> "Maintenance":
        """What to write and prune with the commit of `new_version`: files of a finished
        snapshot, in order; the version below which files may go (-1 for none): the
        newest snapshot at or below the oldest version retention keeps loadable; and the
        run files to delete then, named by no snapshot kept nor by the state's runs
        (`held_runs`); and every run file that retained snapshots, the one in progress
        and the state's runs name (any other run file older than the snapshot pruned to is
        an orphan: an interrupted snapshot's, or a delete that failed). The JVM prunes only
        after the snapshots are written and once that snapshot's file exists, and deletes
        the run files only after it pruned.

        A snapshot's files ship over the commits until the next is due
        (`min_deltas_for_snapshot`), each commit about an even share of them, or as much
        as its delta (`delta_bytes`) or SHIP_MIN_BYTES where that is more, its manifest
        last: no micro-batch writes a whole snapshot. A manifest naming run files of earlier
        snapshots ships only when `list_names` (the partition's files) shows them all
        there: one whose write failed leaves its runs to be written again by the next."""
        if (self._shipping is None and self._pending is not None
                and not self._pending.busy()):
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
            return Maintenance(shipped, -1, [], "", [])
        self.pruned_below = base
        kept = set(held_runs())
        for snapshot in (self._pending, self._shipping and self._shipping[0]):
            if snapshot:
                kept |= snapshot.reused
        if self._shipping is not None:   # its run files written so far and still to come
            kept |= {name for name, _ in self._shipping[1].files if is_run_file(name)}
        gone: set[str] = set()
        for version in list(self.manifests):
            if version < base:
                gone |= self.manifests.pop(version)
        for names in self.manifests.values():
            kept |= names
        return Maintenance(shipped, base, sorted(gone - kept), self.snapshots[base],
                           sorted(kept))

    def _may_ship(self, pending: "Snapshot", made: "Made",
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
            self.snapshots[pending.version] = pending.name
        return out

    def wait_for_snapshot(self) -> None:
        if self._pending is not None:
            self._pending.make()


class Maintenance(NamedTuple):
    snapshots: list      # (name, bytes or local path) to write, in order
    prune_below: int
    delete: list[str]    # run files to delete once pruned
    prune_snapshot: str  # the snapshot file that must exist before anything is pruned
    keep_runs: list[str]   # run files that stay; older others are orphans


def _size(content: bytes | str) -> int:
    return len(content) if not isinstance(content, str) else os.path.getsize(content)
