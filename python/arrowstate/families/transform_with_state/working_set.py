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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...spark_state.transform_with_state import is_map_type
from ...store.versions.time_index import TimeIndex
from ...store.versions.versioned import VersionedState
from .key_columns import KeyColumns
from .kinds import MAP, TIMERS, VALUE
from .schema import StateSchema


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
    """The grouping keys loaded in this task (their Python values: the prefix bytes): their
    values decoded into the variables of `schema`, their columns into `keys`."""

    def __init__(self, state: VersionedState, schema: StateSchema, keys: KeyColumns) -> None:
        self.state, self.schema, self.keys = state, schema, keys
        self.loaded: set = set()
        self.indexes: list[KeyTimeIndex] = []   # the timers' and TTL variables'

    def groups(self, columns: list[pa.Array], num_rows: int) -> list:
        """Each row's grouping key as the variables' dicts hold it here: its prefix bytes."""
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
        owners = [new[i] for i in owner.tolist()]
        self.schema.decode_rows(rows, owners)
        self.keys.loaded(rows, owners)

    def time_index(self, index: TimeIndex) -> "KeyTimeIndex":
        """A timer or TTL index of the partition's, as this task's keys use it."""
        keyed = KeyTimeIndex(index, self)
        self.indexes.append(keyed)
        return keyed

    def drop(self) -> None:
        """After the batch's writes: indexes what it noted, and lets go of the loaded
        keys' values (the tier holds them now)."""
        for index in self.indexes:
            index.flush()
        for var in self.schema.variables.values():
            var.data.clear()
        self.loaded.clear()


class KeyTimeIndex:
    """A `TimeIndex` of grouping keys on the tier (a timer at its time, a TTL element at
    its expiry) as a task uses it: entries noted in the batch (`pending`: (time, grouping
    key)) go in as one bucket, and the keys of the entries that come due are loaded."""

    def __init__(self, index: TimeIndex, working: WorkingSet) -> None:
        self.index, self.working = index, working
        self.pending: list = []

    def flush(self) -> None:
        """Adds the entries noted since the last flush to the index, as one bucket."""
        pending = self.pending
        if pending:
            self.index.add_many(
                np.fromiter((t for t, _ in pending), np.int64, len(pending)),
                np.array([g for _, g in pending], dtype=self.working.state.prefix_dtype))
            pending.clear()

    def due(self, threshold: int) -> tuple[list, list]:
        """The entries at or before `threshold` (those noted in this batch too), in time
        order, their keys loaded."""
        self.flush()
        groups, times = self.index.pop_until(threshold)
        if not len(times):
            return [], []
        order = np.argsort(times, kind="stable")
        groups = groups[order].tolist()
        self.working.load(groups)
        return times[order].tolist(), groups


def tier_objects(state: VersionedState, schema: StateSchema) -> dict:
    """What the family keeps between batches on the tier, from a scan of the stored rows:
    the count of state rows, and the timer and TTL indexes."""
    nk, variables = schema.key_count, schema.variables
    total, names_seen = 0, set()
    timers = TimeIndex()
    ttl = {n: TimeIndex() for n in schema.order if variables[n].ttl is not None}
    for _, rows in state.items(1 << 20):
        names = rows.column(nk)
        names_seen.update(pc.unique(names).to_pylist())
        groups = state.prefix_keys(rows.columns[:nk], rows.num_rows)
        for column, name in enumerate(schema.order):
            picked = np.flatnonzero(pc.equal(names, name).to_numpy(zero_copy_only=False))
            if not len(picked):
                continue
            var = variables[name]
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
        total += schema.orphan_entries(rows, names.to_pylist())
    schema.check_known(names_seen)
    return {"variables": {n: {} for n in schema.order}, "total": total,
            "timerIndex": timers, "ttlIndexes": ttl, "heldKeys": {}}
