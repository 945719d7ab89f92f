"""What a transformWithState batch writes into its state, at its end: each variable's
changed values as put rows (a grouping key's whole value) and removals (a key's value
gone), then the change feed's records of the same operations (changelog).
"""
from __future__ import annotations

import pyarrow as pa

from ...store.versions.versioned import VersionedState
from .changelog import write_changes
from .key_columns import KeyColumns
from .schema import StateSchema
from .variables import variable_column


def write_batch(state: VersionedState, schema: StateSchema, keys: KeyColumns,
                hold_keys: bool) -> None:
    """The variables' changed values of this batch (`schema.variables`), as puts and
    removes keyed by the grouping keys' columns (`keys`); with `hold_keys`, the columns
    of keys with state are kept for later batches, those of keys without let go."""
    written = {}   # variable -> grouping key -> its operations (Variable.dirty)
    for name, var in schema.variables.items():
        changes = var.take_changes()
        if changes:
            written[name] = changes
    put = {}   # variable -> the keys put and their column (see write_changes)
    for column, name in enumerate(schema.order):
        changed = written.get(name)
        if not changed:
            continue
        var = schema.variables[name]
        data = var.data
        present = [g for g in changed if g in data]
        gone = [] if len(present) == len(changed) else [g for g in changed if g not in data]
        if gone:
            columns = keys.store_columns(name, gone)
            state.pop_present(state.keys(columns, len(gone)))
        if present:
            key_columns = keys.store_columns(name, present)
            hkeys = state.keys(key_columns, len(present))
            array = variable_column(var, [data[g] for g in present])
            state.put_rows(hkeys, pa.RecordBatch.from_arrays(
                key_columns + schema.value_columns(column, array), schema=state.schema))
            put[name] = (present, array)
    write_changes(state, schema, keys, written, put)
    if hold_keys:
        keys.hold(dict.fromkeys(g for changed in written.values() for g in changed),
                  schema.variables.values())
