"""transformWithState across runs of a query: the state variables a processor's init()
declares may differ from those the files hold, as Spark allows. A variable the files hold
and init() no longer declares is kept (Spark keeps its column family); one init() deletes
with deleteIfExists goes, with its rows; a variable whose schema changed reads in its new
schema as Spark reads it (store.evolution).
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from ...store.formats import evolution
from ...store.formats import files as store_files
from ...store.versions.versioned import VersionedState
from .clients import DELETED_CLIENTS
from .kinds import MAP
from .variables import Variable
from .working_set import entries_in


class AcrossRuns:
    """The part of the TransformWithState family that reconciles this run's declared
    variables with the files' (a mixin: its state is the family's `schema`, `context`,
    `deleted_undeclared` and `working`)."""

    def keep_columns(self, stored: pa.Schema) -> None:
        """A variable the files hold and this run's init() no longer declares stays, as in
        Spark (its column family stays): its rows are kept as they are and counted in
        numTotalStateRows, and its column comes after the declared ones. Unless init()
        deleted it (deleteIfExists): then its column goes, as Spark removes its column
        family, and its rows with it once loaded (`_attach`)."""
        schema = self.schema
        have = {f.name for f in schema.value_fields}
        for f in stored:
            name = (f.metadata or {}).get(store_files.COLUMN_NAME, b"").decode()
            if not name or name in have:
                continue
            have.add(name)
            if name[2:] in self.deleted_undeclared:
                schema.dropped.append(name[2:])
                self.metrics["numDeletedStateVars"] += 1
            else:
                schema.value_fields.append(pa.field(name, f.type))
                schema.orphans.append(name[2:])

    def evolve_column(self, name: bytes, column: pa.Array, to: pa.DataType) -> pa.Array:
        """A variable's column written in an older schema of it, as Spark reads it: values
        by `fields_by_name`, a map's user keys by position (store.evolution)."""
        var = self.schema.variables.get(name.decode()[2:])
        return evolution.variable_evolved(column, to, self.fields_by_name,
                                          var is not None and var.kind == MAP)

    @property
    def dropped_columns(self) -> tuple[str, ...]:
        return tuple(f"s_{n}" for n in self.schema.dropped)

    def drop_rows(self, state: VersionedState, names: list[str]) -> int:
        """Removes the stored rows of variables whose columns went (a scan, once); the
        state rows Spark counts in them."""
        nk, order = self.schema.key_count, self.schema.order
        columns = [nk + 1 + order.index(n) for n in names if n in order]
        counted = 0
        for rows in state.all_rows(1 << 20):   # a view: removals do not disturb it
            mine = rows.filter(pc.is_in(rows.column(nk), pa.array(names, pa.string())))
            if mine.num_rows:
                state.pop_present(state.keys(mine.columns[:nk + 1], mine.num_rows))
                counted += sum(entries_in(mine.column(c).drop_null()) for c in columns)
        return counted

    def drop_variable(self, state: VersionedState, var: Variable) -> None:
        """Removes every stored row of a deleted variable (a scan, once: after it there are
        none) and makes later uses of it fail."""
        if var.data or self.working is not None:
            self.context.total -= self.drop_rows(state, [var.name])
            var.data.clear()
        for client in var.clients:
            client.__class__ = DELETED_CLIENTS[type(client)]
            client.rebind()
