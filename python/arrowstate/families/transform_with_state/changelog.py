"""transformWithState's change feed.

Spark's change feed of a variable (its RocksDB changelog) has a record per state operation:
an update (a value written, a list's first element on put, a map entry written), an append
(a list element appended, or put after the first) and a delete (a value or list cleared or
expired, a map entry removed, each entry of a cleared map). The variables log the operations
per key in a batch (Variable.logged), and the batch's writes (writes.py) add
them as change records to the delta (see store.files), except the one write a put row
already says (a single value update or list put): `write_changes`.
"""
from __future__ import annotations

import itertools
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from ...store.versions.versioned import VersionedState
from ...store.formats.files import CHANGE_APPEND, CHANGE_UPDATE
from .codec import list_offsets
from .key_columns import KeyColumns
from .kinds import LIST, MAP, TIMERS, VALUE
from .schema import StateSchema
from .variables import Variable


class _Records:
    """Where a batch's change records go: the state, in rows of its schema, keyed by the
    grouping keys' columns."""

    def __init__(self, state: VersionedState, schema: StateSchema, keys: KeyColumns) -> None:
        self.state, self.schema, self.keys = state, schema, keys

    def record(self, var: Variable, column: int, groups: list, array: pa.Array, ops: list,
               owners: pa.Array | None = None) -> None:
        """Change records of `var` (its value column `column`): `array` their values,
        `ops` their operations, the key of each `groups[owners[i]]` (`groups[i]` without
        `owners`)."""
        key_columns = self.keys.store_columns(var.name, groups)
        if owners is not None:
            key_columns = [c.take(owners) for c in key_columns]
        self.state.record_changes(pa.RecordBatch.from_arrays(
            key_columns + self.schema.value_columns(column, array),
            schema=self.state.schema), pa.array(ops, pa.int8()))


def write_changes(state: VersionedState, schema: StateSchema, keys: KeyColumns,
                  written: dict, put: dict) -> None:
    """This batch's state operations (`written`: variable -> grouping key -> its logged
    operations) as change records, per variable and key in the order they ran; one update
    of a value, or one put of a list, that the key's put row already holds is left out (the
    reader derives it from the row). `put`: variable -> (the grouping keys put, their put
    rows' column), whence a list's appended elements are taken rather than converted again.
    `schema`: the state's columns and variables; `keys`: the grouping keys' columns."""
    out = _Records(state, schema, keys)
    for column, name in enumerate(schema.order):
        var = schema.variables[name]
        if not written.get(name) or var.kind == TIMERS:   # timers: no change feed
            continue
        data = var.data
        if var.kind == MAP:
            logged = [(g, r) for g, r in written[name].items() if r]
        else:
            logged = [(g, r) for g, r in written[name].items() if r and not (
                len(r) == 2 and r[0] == CHANGE_UPDATE and data.get(g) == r[1])]
        if not logged:
            continue
        if var.kind == MAP and _map_runs(out, column, var, logged):
            continue
        if var.kind == LIST and name in put and _list_appends(out, column, var, logged,
                                                               *put[name]):
            continue
        groups, owners, ops, payloads = [], [], [], []
        for i, (group, records) in enumerate(logged):
            groups.append(group)
            for op, payload in _change_rows(var.kind, records):
                owners.append(i)
                ops.append(op)
                payloads.append(payload)
        out.record(var, column, groups, _change_column(var, payloads), ops,
                   pa.array(owners, pa.int32()))


def _map_runs(out: _Records, column: int, var: Variable, logged: list) -> bool:
    """A map's change records when each key's operations are one run of one kind (entries
    written, or removed), as they mostly are: one record a key, its entries flattened in
    bulk rather than paired per key; False (nothing recorded) otherwise."""
    flat = list(itertools.chain.from_iterable(records for _, records in logged))
    ops = flat[0::3]   # flat: op, user key, element, ... (every key's records in turn)
    if ops.count(ops[0]) == len(ops):   # one kind in all: one run a key (in C, no loop)
        record_ops = [ops[0]] * len(logged)
    else:
        runs = [records[0::3] for _, records in logged]
        if not all(run.count(run[0]) == len(run) for run in runs):
            return False
        record_ops = [run[0] for run in runs]
    sizes = [len(records) // 3 for _, records in logged]
    user_keys, elements = flat[1::3], flat[2::3]
    entries = pa.StructArray.from_arrays(
        [var.key_codec.stored_to_arrow(user_keys), _with_nulls(var, elements)],
        fields=list(var.type.value_type))
    offsets = pa.array([0, *itertools.accumulate(sizes)], pa.int32())
    array = pa.ListArray.from_arrays(offsets, entries, type=var.type)
    out.record(var, column, [g for g, _ in logged], array, record_ops)
    return True


def _list_appends(out: _Records, column: int, var: Variable, logged: list,
                  groups: list, array: pa.ListArray) -> bool:
    """A list's change records when each key's operations are appends only, as they mostly
    are (and no TTL, whose expiry may have taken elements since): one record a key, its
    appended elements the last ones of the key's put row, taken from that row's column
    rather than converted to Arrow again; False (nothing recorded) otherwise."""
    row_of = dict(zip(groups, range(len(groups))))
    if var.ttl is not None or not all(
            g in row_of and records[0::2].count(CHANGE_APPEND) * 2 == len(records)
            for g, records in logged):
        return False
    rows = np.fromiter((row_of[g] for g, _ in logged), np.int64, len(logged))
    counts = np.fromiter((len(records) // 2 for _, records in logged), np.int64,
                         len(logged))
    ends = array.offsets.to_numpy()[rows + 1].astype(np.int64)
    # each key's last counts[i] elements: ends[i] - counts[i] ... ends[i] - 1, in one array
    firsts = np.cumsum(counts) - counts
    at = np.arange(int(counts.sum())) + np.repeat(ends - counts - firsts, counts)
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]), pa.int32())
    appended = pa.ListArray.from_arrays(offsets, array.values.take(pa.array(at)),
                                        type=var.type)
    out.record(var, column, [g for g, _ in logged], appended,
                   [CHANGE_APPEND] * len(logged))
    return True


def _change_rows(kind: str, records: list) -> Iterator[tuple[int, Any]]:
    """A key's logged operations as change records: one per value operation, list put or
    list delete; a run of list appends as one record of their elements, a run of map
    operations of one kind as one record of their (user key, element or None) pairs."""
    if kind == MAP:
        ops, payloads = records[0::3], zip(records[1::3], records[2::3])
    else:
        ops, payloads = records[0::2], records[1::2]
    if (kind == MAP or (kind == LIST and ops[0] == CHANGE_APPEND)) and \
            ops.count(ops[0]) == len(ops):   # one run (a map's writes, a list's appends)
        yield ops[0], list(payloads)
        return
    run_op, run = None, []
    for op, payload in zip(ops, payloads):
        merges = kind == MAP or (kind == LIST and op == CHANGE_APPEND)
        if run and (not merges or op != run_op):
            yield run_op, run
            run = []
        if merges:
            run_op = op
            run.append(payload)
        else:
            yield op, payload
    if run:
        yield run_op, run


def _change_column(var: Variable, payloads: list) -> pa.Array:
    """Change records' payloads (see Variable.logged) as the variable's column: a value or
    a list of elements (null: a delete), a map's entries (a delete's with null values)."""
    if var.kind == VALUE:
        return _with_nulls(var, payloads)
    lists = [p or [] for p in payloads]
    if var.kind == LIST:
        items = var.store_codec.stored_to_arrow([e for lst in lists for e in lst])
    else:
        pairs = [e for lst in lists for e in lst]
        items = pa.StructArray.from_arrays(
            [var.key_codec.stored_to_arrow([k for k, _ in pairs]),
             _with_nulls(var, [v for _, v in pairs])], fields=list(var.type.value_type))
    return pa.ListArray.from_arrays(pa.array(list_offsets(lists), pa.int32()), items,
                                    type=var.type,
                                    mask=pa.array([p is None for p in payloads]))


def _with_nulls(var: Variable, elements: list) -> pa.Array:
    """Stored elements as Arrow, None as null."""
    if None not in elements:
        return var.store_codec.stored_to_arrow(elements)
    at = itertools.count()
    indices = pa.array([None if e is None else next(at) for e in elements], pa.int32())
    return var.store_codec.stored_to_arrow([e for e in elements if e is not None]).take(indices)
