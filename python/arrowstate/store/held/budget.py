"""A state worker's memory budget: how much of its state stays in memory, where the rest
goes, and the check that the worker stayed within it.

The budget is `spark.arrowstate.worker.memory` when set, else Spark's
`spark.executor.pyspark.memory` divided by `spark.executor.cores`, as Spark divides it among
its Python workers (a state worker serves one task at a time); without either there is no
budget and state stays in memory. Of the budget, the worker's base size (its resident
memory before it held any state) is taken first; `spark.arrowstate.worker.stateMemoryPercent`
of the rest (half by default) may hold state in memory, and the rest is left for a batch's
working set. State over its half lives on local disk in sorted runs (`tier.tiered`, in the
directory `place` gives it): after each commit the largest in-memory parts spill
(`states.HeldStates.keep`). Families whose keys have no fixed width keep their state in
memory, and count against it.
"""
from __future__ import annotations

import atexit
import ctypes
import gc
import itertools
import os
import re
import shutil
import sys
from typing import Any, Iterable

import pyarrow as pa

from ...errors import ArrowStateError
from ..tier.tiered import TierPlace

SETTING = "spark.arrowstate.worker.memory"
MIB = 1 << 20


def resident_bytes() -> int:
    """This process's resident memory (Linux /proc; 0 where that is not there)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def give_back_memory() -> None:
    """Returns freed memory to the system: Python's garbage, what Arrow's allocator keeps
    back, and the free pages glibc's malloc keeps in its heap (malloc_trim; Python's
    small objects live there, so dropped state would otherwise stay resident)."""
    gc.collect()
    pa.default_memory_pool().release_unused()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):   # not glibc: nothing more to give back
        return


def _status_bytes(field: str) -> int:
    try:
        with open("/proc/self/status") as status:
            m = re.search(rf"^{field}:\s+(\d+) kB", status.read(), re.M)
        return int(m.group(1)) * 1024 if m else 0
    except OSError:
        return 0


def reset_peak() -> bool:
    """Starts measuring the peak resident memory afresh (Linux 4.0+); False where it
    cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


def peak_bytes() -> int:
    """The peak resident memory since the last reset_peak (VmHWM)."""
    return _status_bytes("VmHWM")


class MemoryBudget:
    """One worker's budget, set from each task's header (the setting is per session)."""

    def __init__(self) -> None:
        self.total = 0
        self.state_percent = 50
        self.base = 0                       # resident bytes before any state was held
        self.local_dir: str | None = None
        self._roots: dict[str, str] = {}   # local directory -> this worker's part of it
        self._names = itertools.count()
        self._peak_tracked = False

    @property
    def state_share(self) -> int:
        """The bytes of state kept in memory before the largest parts spill to disk."""
        return max(0, self.total - self.base) * self.state_percent // 100

    def configure(self, header: dict[str, Any]) -> None:
        """Takes the task's budget; fails when it is below what the worker needs to run."""
        if not self.base:
            self.base = resident_bytes()
        conf = header["conf"]
        self.total, self.local_dir = max(0, int(conf["memoryBytes"])), header["localDir"]
        self.state_percent = min(100, max(0, int(conf["stateMemoryPercent"])))
        if self.total and self.total < self.base + 64 * MIB:
            need = self.base + 64 * MIB
            raise ArrowStateError(
                "ARROWSTATE_MEMORY_BUDGET_TOO_SMALL",
                f"the state worker's memory budget is {_mib(self.total)}, below what the "
                f"worker needs before it holds any state ({_mib(self.base)} resident, plus "
                f"64 MiB to work in): at least {_mib(need)} is needed (query run "
                f"{header['queryRunId']}, operator {header['operatorId']}, partition "
                f"{header['partitionId']}). Raise {SETTING}, or spark.executor.pyspark.memory "
                "(divided by spark.executor.cores) when that setting is not set.",
                budget=self.total, needed=need, setting=SETTING)
        self._peak_tracked = reset_peak() if self.total else False

    def place(self, state_key: str, without_budget: bool = False) -> TierPlace | None:
        """Where a new partition state keeps its tier; None without a budget, unless
        `without_budget` (a family whose state is cheaper in sorted runs than in a dict):
        then its runs stay in memory."""
        if not self.local_dir or not (self.total or without_budget):
            return None
        root = self._roots.get(self.local_dir)
        if root is None:   # the directory is a per-session setting: one part in each used
            root = self._roots[self.local_dir] = os.path.join(
                self.local_dir, f"arrowstate-worker-{os.getpid()}")
            atexit.register(shutil.rmtree, root, True)
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", state_key)[-80:]
        return TierPlace(os.path.join(root, f"{next(self._names)}-{name}"),
                         memory_cap=max(MIB, self.state_share // 8) if self.total
                         else sys.maxsize)

    def balance(self, states: Iterable) -> None:
        """After a commit: while the state held in memory passes its share, the largest
        parts that can leave memory spill to disk."""
        if not self.total:
            return
        states = list(states)
        held = sum(s.memory_bytes() for s in states)
        for state in sorted(states, key=lambda s: s.rows.memory_bytes(), reverse=True):
            if held <= self.state_share:
                break
            held -= state.rows.spill()
        pa.default_memory_pool().release_unused()   # what Arrow's allocator keeps back

    def check_peak(self, header: dict[str, Any]) -> None:
        """After a task: fails it when the worker's resident memory passed the budget while
        it ran (the batch's working set did not fit), naming the figure it needed."""
        if not self._peak_tracked:
            return
        peak = peak_bytes()
        if peak > self.total:
            raise ArrowStateError(
                "ARROWSTATE_MEMORY_BUDGET_TOO_SMALL",
                f"the state worker's resident memory reached {_mib(peak)} while it ran a "
                f"task, over its memory budget of {_mib(self.total)} (query run "
                f"{header['queryRunId']}, operator {header['operatorId']}, partition "
                f"{header['partitionId']}): state beyond the budget moves to local disk, but "
                f"this batch's working set did not fit beside the worker's base size "
                f"({_mib(self.base)}). Raise {SETTING} (or spark.executor.pyspark.memory) to "
                f"at least {_mib(peak)}, or send smaller micro-batches "
                "(maxFilesPerTrigger, maxOffsetsPerTrigger) or more shuffle partitions.",
                budget=self.total, needed=peak, setting=SETTING)


def _mib(n: int) -> str:
    return f"{n / MIB:.0f} MiB"
