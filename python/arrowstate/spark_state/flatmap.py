"""applyInPandasWithState's state as Spark's stores lay it out. arrowstate stores the key
columns, then the state's fields, whether a value is defined and the timeout timestamp;
Spark's value row is the `groupState` struct (null when undefined) and, when the operator
has timeouts, `timeoutTimestamp`."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .layout import KeyValueLayout

GROUP_STATE, TIMEOUT = "groupState", "timeoutTimestamp"
NO_TIMESTAMP = -1


def is_group_state(value_schema: dict) -> bool:
    """Spark's value of applyInPandasWithState: a `groupState` struct first."""
    fields = value_schema["fields"]
    return bool(fields) and fields[0]["name"] == GROUP_STATE \
        and isinstance(fields[0]["type"], dict)


class FlatMapGroupsWithStateLayout(KeyValueLayout):
    family = "flatMapGroupsWithState"
    holds = ("one row per group with state: the grouping key, and as value the state the "
             "function keeps (GroupState), with its timeout timestamp when it has a timeout")

    def spark_value(self, values: list[pa.Array], n: int, value_schema: dict
                    ) -> pa.StructArray:
        value_names = [f["name"] for f in value_schema["fields"]]
        state_names = [f["name"] for f in value_schema["fields"][0]["type"]["fields"]]
        width = len(state_names)
        defined = pc.fill_null(values[width], False)   # null in a removal record
        group = pa.StructArray.from_arrays(values[:width], names=state_names,
                                           mask=pc.invert(defined))
        columns, names = [group], [GROUP_STATE]
        if TIMEOUT in value_names:
            columns.append(values[width + 1])
            names.append(TIMEOUT)
        return pa.StructArray.from_arrays(columns, names=names)

    def our_values(self, value: pa.StructArray, n: int, value_schema: dict
                   ) -> list[pa.Array]:
        names = [f["name"] for f in value_schema["fields"]]
        group = value.field(0)
        values = list(group.flatten()) + [group.is_valid()]
        values.append(value.field(names.index(TIMEOUT)) if TIMEOUT in names
                      else pa.array(np.full(n, NO_TIMESTAMP, dtype=np.int64)))
        return values


LAYOUT = FlatMapGroupsWithStateLayout()
