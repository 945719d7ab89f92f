"""Merging the tier's runs: their entries in key order, the newest entry of each key winning
(`merged`), at once or paced, a step at a time, in a thread beside the next task
(`PacedMerge`, `Stepper`). Which runs merge, and when, is `schedule`'s."""
from __future__ import annotations

import threading
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa

from .run_writer import RunWriter
from .runs import Run, RunReader

MERGE_ROWS = 1 << 17      # rows a merge or scan reads from each run at a time


class Cursor:
    """Reads a run in chunks, for merges and full scans."""

    def __init__(self, reader: RunReader, chunk: int) -> None:
        self.reader, self.chunk, self.next = reader, chunk, 0
        self.keys = self.alive = self.rows = None

    def fill(self) -> bool:
        """Has buffered entries (reading the next chunk if the buffer is empty)."""
        if self.keys is not None and len(self.keys):
            return True
        n = self.reader.run.n
        if self.next >= n:
            return False
        hi = min(self.next + self.chunk, n)
        self.keys = self.reader.keys(self.next, hi)
        self.alive = self.reader.alive(self.next, hi)
        self.rows = self.reader.rows(self.next, hi)
        self.next = hi
        return True

    def take_to(self, bound) -> tuple[np.ndarray, np.ndarray, pa.RecordBatch]:
        cut = int(np.searchsorted(self.keys, bound, side="right"))
        out = self.keys[:cut], self.alive[:cut], self.rows.slice(0, cut)
        self.keys, self.alive = self.keys[cut:], self.alive[cut:]
        self.rows = self.rows.slice(cut)
        return out


def merged(readers: Sequence[RunReader], chunk: int, keep_dead: bool
            ) -> Iterator[tuple[np.ndarray, np.ndarray, pa.RecordBatch]]:
    """The entries of runs (oldest first) merged in key order, the newest entry of each key
    winning, in pieces of about `chunk` per run: (keys, alive, rows). Dead entries are
    left out unless `keep_dead` (a merge that older runs still lie below must keep them)."""
    cursors = [Cursor(r, chunk) for r in readers]
    while True:
        active = [c for c in cursors if c.fill()]
        if not active:
            return
        bound = min(c.keys[-1] for c in active)
        keys, alive, rows = merge_sorted([c.take_to(bound) for c in active])
        if not keep_dead and not alive.all():
            keys, rows = keys[alive], rows.filter(pa.array(alive))
            alive = alive[alive]
        if len(keys):
            yield keys, alive, rows


def merge_sorted(parts: list) -> tuple[np.ndarray, np.ndarray, pa.RecordBatch]:
    """Sorted pieces of unique keys (oldest first) as one, the newest entry of a key
    winning. The pieces' keys are concatenated and sorted stably: numpy's stable sort
    finds the sorted runs and merges them, about three times faster for fixed-width bytes
    than searching one piece's keys in the other's, and a key's entries come out oldest
    first, so the last of each is kept. The rows are taken once, from all pieces."""
    parts = [p for p in parts if len(p[0])]   # one at least: the piece up to the bound
    if len(parts) == 1:
        return parts[0]
    keys = np.concatenate([k for k, _, _ in parts])
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    last = np.ones(len(keys), dtype=bool)
    last[:-1] = keys[1:] != keys[:-1]
    if not last.all():
        order, keys = order[last], keys[last]
    alive = np.concatenate([a for _, a, _ in parts])[order]
    rows = pa.concat_batches([r for _, _, r in parts]).take(pa.array(order))
    return keys, alive, rows


class PacedMerge:
    """A merge of runs (which stay in the tier meanwhile) that writes its result to disk a
    step at a time; `result` is the run once the last step is done."""

    def __init__(self, tier, runs: list[Run], bottom: bool) -> None:
        self.runs = list(runs)
        self.total = sum(r.n for r in runs)
        self.result: Run | None = None
        self.written = 0      # entries written so far
        self._readers = [RunReader(r, tier.dtype) for r in runs]
        self._pieces = merged(self._readers, MERGE_ROWS, keep_dead=not bottom)
        self._tier = tier
        self._writer: RunWriter | None = None

    def step(self, rows: int) -> None:
        """Writes at least `rows` more entries of the result (all that are left, at most);
        the last step finishes the run."""
        if self._writer is None:
            self._writer = self._tier.run_writer(self.total)
        goal = self.written + rows
        try:
            while self.written < goal:
                piece = next(self._pieces, None)
                if piece is None:
                    self.result = self._writer.finish(self._tier.dtype)
                    self._close_readers()
                    return
                self._writer.write(*piece)
                self.written += len(piece[0])
        except BaseException:
            self.abandon()
            raise

    def abandon(self) -> None:
        if self._writer is not None and self.result is None:
            self._writer.abandon()
        self._writer = None
        self._close_readers()
        if self.result is not None:
            self.result.delete_files()

    def _close_readers(self) -> None:
        readers, self._readers = self._readers, []
        for reader in readers:
            reader.close()


class Stepper(threading.Thread):
    """One step of each paced merge (merge, rows), in turn, in a thread of its own: numpy's
    sorts and Arrow's takes and IPC release the GIL, so it goes on beside the next task."""

    def __init__(self, steps: list[tuple[PacedMerge, int]]) -> None:
        super().__init__(daemon=True, name="arrowstate-tier-merge")
        self.steps, self.error = steps, None
        self.start()

    def run(self) -> None:
        try:
            for merge, rows in self.steps:
                merge.step(rows)
        except BaseException as e:   # raised in the task's thread when it collects this
            self.error = e
