"""Which of the tier's runs merge, and when: runs of one size class merge, FANOUT at a time
(the newer entry of a key wins), so each row is copied about log_FANOUT(n) times, and at
most FANOUT - 1 runs of each class are probed (Bloom filters keep probing cheap).

A merge of PACED_ROWS rows or more is paced: it writes its result a step at a time, in a
thread of its own started as each version commits, each step about PACE times the rows added
to the tier since the one before, so the work of the largest merges is spread over the
micro-batches until the next merge of their size is due instead of landing on one. The
runs it merges stay in place (and answer) until it is done; the change after that swaps
its result in. How runs merge is `merging`'s.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from .merging import PacedMerge, Stepper

FANOUT = 4                # runs of one size class merged into one
# a merge of this many rows or more is paced over micro-batches (smaller ones, of runs that
# may still be in memory, are done at once: a paced merge holds its runs until it ends)
PACED_ROWS = 1 << 22
PACE = 1.5                # rows a paced merge writes per row added to the tier meanwhile
PACE_STEPS = 16           # and at least this fraction of its rows per step (state at rest)


def _size_class(n: int) -> int:
    """Runs within a factor FANOUT of each other share a class."""
    size_class = 0
    while n >= FANOUT:
        n //= FANOUT
        size_class += 1
    return size_class


class MergeSchedule:
    """The merges of one tier (`tiered.TieredRows`): planned as runs are added, the paced
    ones stepped after each commit and swapped in once done."""

    def __init__(self, tier) -> None:
        self._tier = tier
        self.paced: list[PacedMerge] = []     # paced merges not yet swapped in
        self.stepper: Stepper | None = None   # the thread stepping them, if running
        self.started = 0              # paced merges started (for tests and metrics)
        self._added = 0               # rows added since the last step began
        self._unpaced = False         # see `unpaced`

    def added(self, rows: int) -> None:
        """After a run of `rows` entries is appended to the tier: plans the merges it
        completes (stepped whole at once when not paced)."""
        self._added += rows
        self.plan()
        if self._unpaced:
            self.step(whole=True)

    def plan(self) -> None:
        """Merges every FANOUT or more consecutive runs (none of them merging) of one size
        class or smaller below the newest of them, newest first, until none are left: the
        newest runs as they are added, and a paced merge's result once swapped in among
        runs of its class."""
        runs = self._tier.runs
        top = len(runs) - 1
        while top >= FANOUT - 1:
            merging = self.merging_runs()
            size_class = _size_class(runs[top].n)
            bottom = top + 1
            while (bottom > 0 and _size_class(runs[bottom - 1].n) <= size_class
                   and id(runs[bottom - 1]) not in merging):
                bottom -= 1
            if top + 1 - bottom < FANOUT:
                top -= 1
                continue
            taken = runs[bottom:top + 1]
            if sum(r.n for r in taken) >= PACED_ROWS:
                self.paced.append(PacedMerge(self._tier, taken, bottom == 0))
                self.started += 1
                top = bottom - 1
                continue
            runs[bottom:top + 1] = [self._tier.merge_runs(taken, bottom=bottom == 0)]
            top = len(runs) - 1   # the result may complete a class above it

    def merging_runs(self) -> set[int]:
        """The ids of the runs that paced merges hold."""
        return {id(r) for merge in self.paced for r in merge.runs}

    def collect(self, wait: bool) -> None:
        """Once no step is running (waiting for one with `wait`), swaps each finished
        merge's result in for its runs and deletes their files. A step that failed raises
        its error here."""
        stepper = self.stepper
        if stepper is not None:
            if stepper.is_alive() and not wait:
                return
            stepper.join()
            self.stepper = None
            if stepper.error is not None:
                self.drop()
                raise stepper.error
        runs = self._tier.runs
        done = [m for m in self.paced if m.result is not None]
        for merge in done:
            self.paced.remove(merge)
            start = next(i for i, r in enumerate(runs) if r is merge.runs[0])
            assert all(a is b for a, b in zip(runs[start:start + len(merge.runs)],
                                              merge.runs))
            runs[start:start + len(merge.runs)] = [merge.result]
            for run in merge.runs:   # views opened before hold their files open
                run.delete_files()
        if done:
            self.plan()

    @contextlib.contextmanager
    def unpaced(self) -> Iterator[None]:
        """Within it, merges are not paced: each runs whole in the background as soon as
        the one before is done (a state being loaded: no micro-batches to spread them
        over)."""
        self._unpaced = True
        try:
            yield
        finally:
            self._unpaced = False

    def step(self, whole: bool = False) -> None:
        """Starts the next step of the paced merges (`whole`: all that is left of them),
        unless one is still running (the rows added meanwhile then count toward the step
        after it)."""
        self.collect(wait=False)
        if self.stepper is not None:
            return
        added, self._added = self._added, 0
        if not self.paced:
            return
        quotas = [merge.total if whole
                  else max(int(PACE * added), -(-merge.total // PACE_STEPS))
                  for merge in self.paced]
        self.stepper = Stepper(list(zip(self.paced, quotas)))

    def drop(self) -> None:
        """Ends the paced merges unfinished, deleting what they wrote."""
        if self.stepper is not None:
            self.stepper.join()
            self.stepper = None
        merges, self.paced = self.paced, []
        for merge in merges:
            merge.abandon()

    def settle(self) -> None:
        """Finishes every paced merge now (tests; a state at rest)."""
        while self.paced:
            self.collect(wait=True)
            for merge in self.paced:
                merge.step(merge.total)
            self.collect(wait=True)
