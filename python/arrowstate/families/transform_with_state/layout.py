"""How transformWithState state is laid out, for the live family and the offline tools
(state_data, tws_state) alike: this module needs pyarrow only.

State layout: one row per grouping key and state variable: the grouping key columns and
`__state` (the variable's name) as key; one typed value column per variable (a struct for
a value, a list of structs for a list, a list of key/value structs for a map), null in the
other variables' rows. In memory each variable is a dict from grouping key to Python
values, kept with the partition's state between batches. A key's timers are one more such
variable, `$timers` (its sorted expiry times), in time modes that have timers. The files
name the value columns, so a processor may add variables between runs.
"""
from __future__ import annotations

import pyarrow as pa

STATE_NAME = "__state"
VALUE, LIST, MAP, TIMERS = "value", "list", "map", "timers"
TIMER_VARIABLE = "$timers"   # "$" names are Spark's own column families, never a processor's
COUNTED_METRICS = ("numValueStateVars", "numListStateVars", "numMapStateVars",
                   "numDeletedStateVars", "numValueStateWithTTLVars", "numListStateWithTTLVars",
                   "numMapStateWithTTLVars", "numRegisteredTimers", "numDeletedTimers",
                   "numExpiredTimers", "numValuesRemovedDueToTTLExpiry",
                   "timerProcessingTimeMs", "initialStateProcessingTimeMs")


def is_map_type(t: pa.DataType) -> bool:
    """A map variable's column: a list of key/value structs."""
    return (pa.types.is_list(t) and pa.types.is_struct(t.value_type)
            and [f.name for f in t.value_type] == ["key", "value"])
