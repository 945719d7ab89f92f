"""transformWithState, in the modules Spark's own transformwithstate package has:
- kinds: the kinds of state variable, and the metrics counted of them;
- codec: state values <-> Arrow, as Spark stores them;
- variables: the value, list and map variables, with their TTLs;
- clients: what pyspark's state objects call for the current key;
- timers: the timers and their expiry;
- changelog: the change feed's records;
- handle: pyspark's StatefulProcessorHandle and states over what is held here;
- processor_input: each key's rows, cut as pyspark's worker hands them over;
- family: TransformWithState, the family itself;
- pre_init: the processor's init() for Spark's planning on the driver.
Its rows, and Spark's layout of them, are spark_state.transform_with_state's.
"""
from __future__ import annotations

from .family import TransformWithState

__all__ = ["TransformWithState"]
