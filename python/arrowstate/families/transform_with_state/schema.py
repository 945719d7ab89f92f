"""The columns transformWithState's state rows are stored in, and its variables' values read
from them. A row holds one grouping key's value of one variable: the grouping key's columns
and `__state` (the variable's name), then a value column per variable (`s_<name>`), the
row's own filled and the others null: the variables init() declares (the timers' included)
in name order, then those the files hold from an earlier run that this run keeps without a
declaration (see across_runs). Spark's layout of these rows: spark_state.transform_with_state.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from ... import keys as keycodec
from ...spark_state.transform_with_state import TIMER_VARIABLE, is_map_type
from .codec import state_error
from .variables import column_values


class StateSchema:
    """`key_fields`: the grouping key's fields and `__state`; `variables`: name -> the
    declared variable (timers' included); `order`: their names in column order;
    `value_fields`: their columns, then those kept from earlier runs (`orphans`, by name);
    `dropped`: variables an init() deleted without declaring them, which the files hold
    (their columns are left out of the load)."""

    def __init__(self, key_fields: list[pa.Field], variables: dict) -> None:
        self.key_fields = key_fields
        self.key_count = len(key_fields) - 1   # the grouping key's columns
        self.key_names = [f.name for f in key_fields[:-1]]
        self.variables = variables
        self.order = sorted(variables)
        self.value_fields = [pa.field(f"s_{n}", variables[n].type) for n in self.order]
        self.orphans: list[str] = []
        self.dropped: list[str] = []

    def value_columns(self, column: int, array: pa.Array) -> list[pa.Array]:
        """The value columns of rows of one variable: `array` in its column (the
        variable's place in `order`), the other variables' columns null."""
        return [array if i == column else pa.nulls(len(array), f.type)
                for i, f in enumerate(self.value_fields)]

    def decode_rows(self, rows: pa.RecordBatch, groups: list, data: dict | None = None) -> None:
        """Stored rows' values, decoded into `data` (name -> key -> value), by default the
        variables' own dicts; `groups`: each row's grouping key."""
        nk = self.key_count
        names = rows.column(nk).to_pylist()
        for column, name in enumerate(self.order):
            var = self.variables[name]
            picked = [i for i, n in enumerate(names) if n == name]
            if not picked:
                continue
            decoded = column_values(var, rows.column(nk + 1 + column).take(pa.array(picked)))
            target = var.data if data is None else data[name]
            for i, value in zip(picked, decoded):
                target[groups[i]] = value

    def check_known(self, names) -> None:
        """Fails on stored rows of variables this processor neither declares nor keeps."""
        unknown = set(names) - set(self.order) - set(self.orphans) - set(self.dropped)
        if unknown:
            raise state_error(f"the stored state holds variables {sorted(unknown)} that "
                              "the processor does not define")

    def orphan_entries(self, rows: pa.RecordBatch, names: list) -> int:
        """Rows Spark counts of the variables kept without a declaration: a value or a list
        one, a map its entries (the column's type tells a map: a list of key/value structs),
        timers none."""
        nk, total = self.key_count, 0
        for j, name in enumerate(self.orphans, start=len(self.order)):
            picked = [i for i, n in enumerate(names) if n == name]
            if not picked or name == TIMER_VARIABLE:
                continue
            column = rows.column(nk + 1 + j).take(pa.array(picked))
            total += (pc.sum(pc.list_value_length(column)).as_py() or 0
                      if is_map_type(column.type) else len(picked))
        return total

    def held_in_memory(self, rows: pa.RecordBatch, holds_keys: bool) -> dict:
        """What the family keeps between batches for state in memory, from the stored
        rows (after a load from files): every variable's values, the count of state rows,
        and, when timers or TTLs change a key's state without its rows (`holds_keys`),
        every key's columns."""
        nk = self.key_count
        groups = keycodec.rows(rows.columns[:nk], rows.num_rows)
        names = rows.column(nk).to_pylist()
        data = {n: {} for n in self.order}
        self.decode_rows(rows, groups, data)
        self.check_known(names)
        total = sum(self.variables[n].entries_of(v) for n, d in data.items() for v in d.values())
        total += self.orphan_entries(rows, names)
        key_batch = rows.select(range(nk))
        held_keys = {g: (key_batch, i) for i, g in enumerate(groups)} if holds_keys else {}
        return {"variables": data, "total": total, "timerHeap": [], "heldKeys": held_keys,
                "ttlIndexes": {}}
