"""transformWithState's state on the tier (a worker with a memory budget): the state rows
live in `TieredRows`, found by grouping key as their prefix (all of a key's variables in
one prefix scan), and only the keys a batch touches are decoded into the variables' dicts:
the keys of its input rows and initial state, and those whose timers or TTLs come due. They
are dropped after the commit, so memory holds the tier's index, not the state.

Timers and TTL expiries are indexed by grouping key in `TimeIndex`es (numpy: the key's
prefix bytes and a time, about 30 bytes an entry), not in heaps of Python tuples: a
timer at its time, a TTL variable's element (a value, a list's element, a map's entry) at
its expiry. An entry whose timer was deleted or whose element was rewritten since is
passed over when it comes due, as the in-memory heaps pass them over.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...spark_state.transform_with_state import is_map_type
from ...store.versions.time_index import TimeIndex
from ...store.versions.versioned import VersionedState
from .kinds import MAP, TIMERS, VALUE

if TYPE_CHECKING:
    from .family import TransformWithState


def entries_in(column: pa.Array) -> int:
    """State rows Spark counts in a variable's column (its rows only): a value or a list
    one, a map its entries."""
    if is_map_type(column.type):
        return pc.sum(pc.list_value_length(column)).as_py() or 0
    return len(column)


def element_expiries(kind: str, column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The TTL expiry (ms) of each element in the rows of a TTL variable's column, and the
    row each is in."""
    if kind == VALUE:
        return (column.field("expiresAtMs").to_numpy(zero_copy_only=False),
                np.arange(len(column)))
    flat = column.flatten()
    expiries = (flat.field("value") if kind == MAP else flat).field("expiresAtMs")
    counts = pc.list_value_length(column).to_numpy(zero_copy_only=False)
    return (expiries.to_numpy(zero_copy_only=False),
            np.repeat(np.arange(len(column)), counts))


class WorkingSet:
    """The grouping keys loaded in this task (their Python values: the prefix bytes)."""

    def __init__(self, family: "TransformWithState", state: VersionedState) -> None:
        self.family, self.state = family, state
        self.loaded: set = set()

    def groups(self, columns: list[pa.Array], num_rows: int) -> list:
        """Each row's grouping key as the family's dicts hold it here: its prefix bytes."""
        return self.state.prefix_keys(columns, num_rows).tolist()

    def load(self, groups) -> None:
        """Decodes the stored rows of the keys not loaded yet (one prefix scan for all)."""
        new = [g for g in dict.fromkeys(groups) if g not in self.loaded]
        if not new:
            return
        self.loaded.update(new)
        state = self.state
        owner, ids = state.scan_prefixes(np.array(new, dtype=state.prefix_dtype))
        if not len(ids):
            return
        rows = state.take(ids)
        self.family.load_rows(rows, [new[i] for i in owner.tolist()])

    def index(self, index: TimeIndex, pending: list) -> None:
        """Adds (time, grouping key) entries noted in this batch to an index, as one bucket."""
        if pending:
            index.add_many(np.fromiter((t for t, _ in pending), np.int64, len(pending)),
                           np.array([g for _, g in pending], dtype=self.state.prefix_dtype))
            pending.clear()

    def due(self, index: TimeIndex, threshold: int) -> tuple[list, list]:
        """The entries at or before `threshold`, in time order, their keys loaded."""
        groups, times = index.pop_until(threshold)
        if not len(times):
            return [], []
        order = np.argsort(times, kind="stable")
        groups = groups[order].tolist()
        self.load(groups)
        return times[order].tolist(), groups

    def drop(self) -> None:
        """Lets go of the loaded keys' values (after the commit: the tier holds them)."""
        for var in self.family.variables.values():
            var.data.clear()
        self.loaded.clear()

    def rebuild(self) -> dict:
        """What the family keeps between batches, from a scan of the stored rows: the count
        of state rows, and the timer and TTL indexes."""
        family, state = self.family, self.state
        nk = len(family.key_fields) - 1
        total, names_seen = 0, set()
        timers = TimeIndex()
        ttl = {n: TimeIndex() for n in family.order if family.variables[n].ttl is not None}
        for _, rows in state.items(1 << 20):
            names = rows.column(nk)
            names_seen.update(pc.unique(names).to_pylist())
            groups = state.prefix_keys(rows.columns[:nk], rows.num_rows)
            for column, name in enumerate(family.order):
                picked = np.flatnonzero(pc.equal(names, name).to_numpy(zero_copy_only=False))
                if not len(picked):
                    continue
                var = family.variables[name]
                values = rows.column(nk + 1 + column).take(pa.array(picked))
                if var.kind == TIMERS:
                    counts = pc.list_value_length(values).to_numpy(zero_copy_only=False)
                    timers.add_many(values.flatten().to_numpy(zero_copy_only=False),
                                    np.repeat(groups[picked], counts))
                    continue
                total += entries_in(values)
                if var.ttl is not None:
                    expiries, row = element_expiries(var.kind, values)
                    ttl[name].add_many(expiries, groups[picked][row])
            total += family.orphan_entries(rows, names.to_pylist())
        family.check_known(names_seen)
        return {"variables": {n: {} for n in family.order}, "total": total,
                "timerIndex": timers, "ttlIndexes": ttl, "heldKeys": {}}
