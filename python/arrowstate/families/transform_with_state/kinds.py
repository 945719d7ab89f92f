"""The kinds of state a processor keeps (value, list and map variables, and the timers'), and
the metrics counted of them. How a partition's rows hold them (one row per grouping key and
variable; the `__state` and `$timers` names) is in spark_state.transform_with_state, which
the offline tools read too. In memory each variable is a dict from grouping key to Python
values, kept with the partition's state between batches.
"""
from __future__ import annotations

VALUE, LIST, MAP, TIMERS = "value", "list", "map", "timers"
COUNTED_METRICS = ("numValueStateVars", "numListStateVars", "numMapStateVars",
                   "numDeletedStateVars", "numValueStateWithTTLVars", "numListStateWithTTLVars",
                   "numMapStateWithTTLVars", "numRegisteredTimers", "numDeletedTimers",
                   "numExpiredTimers", "numValuesRemovedDueToTTLExpiry",
                   "timerProcessingTimeMs", "initialStateProcessingTimeMs")
