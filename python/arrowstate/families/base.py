"""What every operator family is (`StateFamily`) and what families share (`FamilyBase`):
watermark thresholds, timing of updates and removals, rebuilding the time index after a
load, and expiring what the eviction watermark closes."""
from __future__ import annotations

import itertools
import time
from typing import Any, ClassVar, Hashable, Iterable, Protocol, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import keys as keycodec
from ..spark_state.layout import SparkLayout
from ..store.formats import evolution
from ..store.versions.versioned import VersionedState


class StateFamily(Protocol):
    """One operator family's state logic in the worker. The worker makes one per task from
    the header's `operator` fields and the schema of the rows the JVM sends."""

    name: ClassVar[str]
    layout: ClassVar[SparkLayout]   # its rows as Spark's stores lay them out (offline tools)
    key_fields: list[pa.Field]     # the state's key columns
    value_fields: list[pa.Field]   # the state's value columns
    metrics: dict[str, int]        # reported after the commit (names from contract.json)

    def rebuild_index(self, state: VersionedState) -> None:
        """Rebuilds the state's time index after a load from files."""

    def lookup(self, state: VersionedState, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        """Answers a LOOKUP frame: reads state, changes nothing."""

    def process(self, state: VersionedState, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        """Answers a DATA frame: one batch of input."""

    def finish(self, state: VersionedState) -> Iterable[pa.RecordBatch]:
        """After all input: evictions, timeouts, and the batches to emit last."""


def gather_rows(picks: Sequence[tuple[pa.RecordBatch, int]],
                names: Sequence[str]) -> pa.RecordBatch:
    """Rows picked from batches (`(batch, row)` pairs), in order, as one batch with column
    `names`: one take per run of picks from the same batch."""
    parts = []
    for _, run in itertools.groupby(picks, key=lambda pick: id(pick[0])):
        run = list(run)
        taken = run[0][0].take(pa.array([row for _, row in run]))
        parts.append(pa.RecordBatch.from_arrays(taken.columns, names=list(names)))
    return pa.concat_batches(parts) if len(parts) > 1 else parts[0]


def sorted_by_key(batches: list[pa.RecordBatch], key_indices: list[int],
                  max_rows: int) -> list[pa.RecordBatch]:
    """A task's input rows, which the JVM did not sort, sorted by their key columns as
    Spark's sort before a grouping operator orders them (ascending, nulls first; stable),
    in batches of at most max_rows rows. The JVM leaves the sort to the worker only for
    keys that Arrow orders and compares as Spark does (no floats, nothing nested)."""
    if not batches:
        return []
    table = pa.Table.from_batches(batches)
    # by position: a key column may share its name with a value column
    keys = pa.table([table.column(i) for i in key_indices],
                    names=[f"k{j}" for j in range(len(key_indices))])
    try:   # pyarrow 25 and later take the null placement per key
        order = pc.sort_indices(keys, sort_keys=[(name, "ascending", "at_start")
                                                 for name in keys.column_names])
    except (TypeError, ValueError):
        order = pc.sort_indices(keys, sort_keys=[(name, "ascending")
                                                 for name in keys.column_names],
                                null_placement="at_start")
    table = table.take(order)
    return table.combine_chunks().to_batches(max_chunksize=max_rows)


def grouped_by_key(batch: pa.RecordBatch, key_indices: list[int],
                   max_rows: int) -> list[pa.RecordBatch]:
    """A real-time flush's rows with each key's rows together, in the order they came, the
    keys in the order their first rows came (as Spark's real-time operators take rows as
    they arrive; a sort would order them by key), in batches of at most max_rows rows.
    Keys are told apart as `keys.rows` tells them (what the families group by). A flush of
    distinct keys, the usual one, goes as it is."""
    n = batch.num_rows
    if n > 1:
        groups = keycodec.rows([batch.column(i) for i in key_indices], n)
        where: dict = {}
        for i, group in enumerate(groups):
            where.setdefault(group, []).append(i)
        if len(where) < n:
            order = [i for rows in where.values() for i in rows]
            if order != list(range(n)):
                batch = batch.take(pa.array(order, pa.int64()))
    if n <= max_rows:
        return [batch]
    return [batch.slice(start, max_rows) for start in range(0, n, max_rows)]


class UnsortedInput:
    """A function family's input rows when the JVM did not sort them by key (the operator's
    `inputSorted` false): held until the task's last batch, then sorted once. Not in
    real-time mode, where each flush's rows are grouped by key on their own
    (`grouped_by_key`)."""

    def __init__(self, operator: dict[str, Any], key_indices: list[int],
                 max_rows: int) -> None:
        self.batches: list[pa.RecordBatch] | None = (
            None if operator.get("inputSorted", True) or operator.get("realTime") else [])
        self.key_indices, self.max_rows = key_indices, max_rows

    def hold(self, batch: pa.RecordBatch) -> bool:
        """Keeps the batch for the task's end, when the rows need sorting."""
        if self.batches is None:
            return False
        self.batches.append(batch)
        return True

    def sorted(self) -> list[pa.RecordBatch]:
        """Every batch held, sorted by key (empty when none is)."""
        if not self.batches:
            return []
        batches, self.batches = self.batches, []
        return sorted_by_key(batches, self.key_indices, self.max_rows)


def live_clock_ms() -> int:
    """The executor's clock now, in ms: processing time in real-time mode, where a batch runs
    for its whole duration and timers and timeouts are checked against the live clock after
    each flush (as Spark's real-time transformWithState checks them after each row)."""
    return time.time_ns() // 1_000_000


def micros(ms: int | None) -> int | None:
    return None if ms is None else ms * 1000


# the metrics every family's state reports, and with them those of families that drop late rows
STORE_METRICS = ("numUpdatedStateRows", "numRemovedStateRows", "allUpdatesTimeMs",
                 "allRemovalsTimeMs")
WATERMARK_METRICS = STORE_METRICS + ("numRowsDroppedByWatermark",)


class FamilyBase:
    """Shared parts. A family sets its key and value fields and `metrics`, and says how rows
    enter the time index (`index_rows`), if it uses one."""

    name: ClassVar[str]
    # whether the set of value columns may grow between runs (see VersionedState)
    named_columns: ClassVar[bool] = False
    # whether its state may live in sorted runs on local disk under a memory budget: the
    # family handles keys only as `state.keys` makes them (a list or an array) and selects
    # them with `state.pick`
    tiered: bool = False
    # whether its state lives in sorted runs (in memory) without a budget too: for a family
    # whose every batch replaces and removes many rows, whole-batch numpy and Arrow work
    # costs less there than a dict's Python work per key
    runs_without_budget: ClassVar[bool] = False
    # whether its state without a budget moves fixed-width keys from the dict to a hash
    # table in compiled code (store.rows.hashed) once large: for a tiered family whose batches
    # look up, store and remove many keys and that does no Python work per key. With
    # runs_without_budget and a prefix, the state starts in such a table that also finds
    # a prefix's rows (store.rows.prefixed) rather than in runs, where pandas has the table
    hashed_keys: ClassVar[bool] = False
    # the key fields, first of the key, whose rows the family finds together on the tier
    # (VersionedState's prefix_count)
    prefix_count: int = 0

    def __init__(self, operator: dict[str, Any], metric_names: Sequence[str]) -> None:
        self.late_threshold = micros(operator.get("lateEventsWatermarkMs"))
        self.evict_threshold = micros(operator.get("evictionWatermarkMs"))
        self.metrics = dict.fromkeys(metric_names, 0)
        self._update_ns = 0
        self._removal_ns = 0

    # -- timing -----------------------------------------------------------------------------
    def updating(self) -> "_Timed":
        """`with self.updating():` adds the block's time to allUpdatesTimeMs."""
        return _Timed(self, "_update_ns")

    def removing(self) -> "_Timed":
        """`with self.removing():` adds the block's time to allRemovalsTimeMs."""
        return _Timed(self, "_removal_ns")

    def close_timings(self) -> None:
        if "allUpdatesTimeMs" in self.metrics:
            self.metrics["allUpdatesTimeMs"] = self._update_ns // 1_000_000
        if "allRemovalsTimeMs" in self.metrics:
            self.metrics["allRemovalsTimeMs"] = self._removal_ns // 1_000_000

    def keep_columns(self, stored: pa.Schema) -> None:
        """Called before a load (with the files' columns) or on cached state (with its own),
        for families with named columns: a family that keeps value columns it does not
        declare adds them to its value fields here; one that drops some on purpose names
        them in `dropped_columns`, which the load then leaves out of the files it reads."""

    dropped_columns: tuple[str, ...] = ()
    def evolve_column(self, name: bytes, column: pa.Array, to: pa.DataType) -> pa.Array:
        """A named stored column written in an older schema, in this run's type `to` (or
        ValueError, for a change Spark does not allow). Families with named columns whose
        types may change say how; others read fields by position."""
        return evolution.positional(name, column, to)

    # -- time index -------------------------------------------------------------------------
    def index_rows(self, state: VersionedState, keys: list[Hashable],
                   rows: pa.RecordBatch) -> None:
        """Adds stored rows to the time index; families without one keep this no-op."""

    def rebuild_index(self, state: VersionedState) -> None:
        if type(self).index_rows is FamilyBase.index_rows:
            return   # no index: nothing to read
        for keys, rows in state.items(1 << 20):
            self.index_rows(state, keys, rows)

    def expire(self, state: VersionedState) -> pa.RecordBatch | None:
        """Removes the keys the eviction watermark closes; their rows (None without one)."""
        if self.evict_threshold is None:
            return None
        closed, _ = state.index.pop_until(self.evict_threshold)
        evicted = state.pop_present(closed)
        self.metrics["numRemovedStateRows"] += evicted.num_rows
        return evicted

    def late_mask(self, micros_: np.ndarray, valid: np.ndarray) -> np.ndarray | None:
        """Rows at or below the late-events watermark (counted as dropped), or None."""
        if self.late_threshold is None:
            return None
        late = valid & (micros_ <= self.late_threshold)
        self.metrics["numRowsDroppedByWatermark"] += int(late.sum())
        return late

    def lookup(self, state: VersionedState, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        raise RuntimeError(f"arrowstate: the {self.name} family answers no LOOKUP frame")

    def initial_state(self, state: VersionedState, batch: pa.RecordBatch) -> None:
        raise RuntimeError(f"arrowstate: the {self.name} family takes no INITIAL_STATE frame")


class _Timed:
    __slots__ = ("_owner", "_field", "_start")

    def __init__(self, owner: FamilyBase, field: str) -> None:
        self._owner, self._field = owner, field

    def __enter__(self) -> None:
        self._start = time.perf_counter_ns()

    def __exit__(self, *exc) -> None:
        setattr(self._owner, self._field,
                getattr(self._owner, self._field) + time.perf_counter_ns() - self._start)
