"""transformWithState, in the modules Spark's own transformwithstate package has:
- layout: how state rows are laid out (needs pyarrow only: the offline tools use it);
- codec: state values <-> Arrow, as Spark stores them;
- variables: the value, list and map variables, with their TTLs;
- clients: what pyspark's state objects call for the current key;
- timers: the timers and their expiry;
- changelog: the change feed's records;
- handle: pyspark's StatefulProcessorHandle and states over what is held here;
- processor_input: each key's rows, cut as pyspark's worker hands them over;
- family: TransformWithState, the family itself;
- pre_init: the processor's init() for Spark's planning on the driver;
- spark_layout: its rows as Spark's stores lay them out, for the offline tools.
The family loads on first use of `TransformWithState`, so the offline tools that import
`layout` need not load pyspark's function machinery.
"""
from __future__ import annotations

from typing import Any

from .layout import (COUNTED_METRICS, LIST, MAP, STATE_NAME, TIMER_VARIABLE, TIMERS, VALUE,
                     is_map_type)

__all__ = ["TransformWithState", "STATE_NAME", "TIMER_VARIABLE", "VALUE", "LIST", "MAP",
           "TIMERS", "COUNTED_METRICS", "is_map_type"]


def __getattr__(name: str) -> Any:
    if name == "TransformWithState":
        from .family import TransformWithState
        return TransformWithState
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
