"""The grouping keys' columns in transformWithState: the key columns of the state rows a
batch writes, and the key a timer's handler gets as a Row. A grouping key is held as a
hashable value (in memory: keys.rows; on the tier: its prefix bytes); its columns as a key
batch and a row of it, taken from where the key came: the batch's input rows, its initial
state, or its stored rows.
"""
from __future__ import annotations

import pyarrow as pa

from ..base import gather_rows


def plain_key_column(key_fields: list[pa.Field]):
    """For one grouping column of integers or strings, whose grouping keys in memory are
    its values as they are (keys.column_values: ints; a string's bytes), the column of
    some keys made from them directly (no gather from the batches they came in); else
    None."""
    if len(key_fields) != 1:
        return None
    t = key_fields[0].type
    if pa.types.is_integer(t):
        return lambda groups: pa.array(groups, t)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        raw = pa.binary() if pa.types.is_string(t) else pa.large_binary()
        return lambda groups: pa.array(groups, raw).view(t)
    return None


class KeyColumns:
    """`seen`: grouping key -> (key batch, row) of the keys this batch has seen (its input
    rows, its initial state, the keys loaded from the tier); `held`: the same of every key
    with state, kept between batches for state in memory with timers or TTLs (a key's
    state changes then in batches without its rows). `on_tier`: grouping keys are prefix
    bytes, never the key columns' own values."""

    def __init__(self, key_fields: list[pa.Field], held: dict, on_tier: bool) -> None:
        self.names = [f.name for f in key_fields]
        self.seen: dict = {}
        self.held = held
        self._plain = None if on_tier else plain_key_column(key_fields)

    def of(self, group) -> tuple[pa.RecordBatch, int]:
        return self.seen.get(group) or self.held[group]

    def values(self, group) -> dict:
        """The key's column values by name (a timer's key Row)."""
        key_batch, row = self.of(group)
        return dict(zip(self.names, (c[row].as_py() for c in key_batch.columns)))

    def loaded(self, rows: pa.RecordBatch, groups: list) -> None:
        """Stored rows loaded on the tier (`groups`: each row's grouping key): their key
        columns, where this batch has not brought the key's."""
        key_batch = rows.select(range(len(self.names)))
        seen = self.seen
        for i, g in enumerate(groups):
            seen.setdefault(g, (key_batch, i))

    def store_columns(self, name: str, groups: list) -> list[pa.Array]:
        """The store's key columns (grouping key columns and the variable's name) of rows
        of variable `name` for these grouping keys."""
        if self._plain is not None:
            keys = [self._plain(groups)]
        else:
            keys = gather_rows([self.of(g) for g in groups], self.names).columns
        return list(keys) + [pa.array([name] * len(groups), pa.string())]

    def hold(self, groups, variables) -> None:
        """Keeps the key columns of keys that have state in any of `variables` (one take
        for the new ones), drops those of keys that have none left."""
        held, new = self.held, []
        for g in groups:
            if any(g in var.data for var in variables):
                if g not in held:
                    new.append(g)
            else:
                held.pop(g, None)
        if new:
            keys = gather_rows([self.seen[g] for g in new], self.names)
            for i, g in enumerate(new):
                held[g] = (keys, i)
