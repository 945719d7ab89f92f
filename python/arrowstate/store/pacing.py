"""Paced merges of the tier's runs (`tier`): a merge that writes its result a step at a time,
and the thread that runs one step of each after a commit, beside the next task."""
from __future__ import annotations

import threading

from .runs import MERGE_ROWS, Run, RunReader, RunWriter, merged


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
