"""transformWithState, split by concept as Spark's own transformwithstate package is; the
lower modules first, none importing one below it in this list or the family:
- kinds: the kinds of state variable, and the metrics counted of them;
- codec: state values <-> Arrow, as Spark stores them;
- context: what state operations run in: the key being processed, metrics, row count;
- variables: the value, list and map variables, with their TTLs;
- timers: the timers and their expiry;
- clients: what pyspark's state objects call for the current key;
- handle: pyspark's StatefulProcessorHandle and states, and what init() declares;
- schema: the state rows' columns, and the variables' values read from them;
- key_columns: the grouping keys' columns (rows written, timers' keys);
- working_set: state on the tier: the keys a batch loads, timer and TTL indexes;
- changelog: the change feed's records;
- writes: a batch's changed values written as state rows, with their change feed;
- across_runs: variables kept, deleted or evolved between runs (part of the family);
- processor_input: each key's rows, whole, cut as pyspark's worker hands them over;
- processor_output: the processor's results as Arrow batches;
- family: TransformWithState, the family itself, which drives a task;
- pre_init: the processor's init() for Spark's planning on the driver.
Its rows, and Spark's layout of them, are spark_state.transform_with_state's.
"""
from __future__ import annotations

from .family import TransformWithState

__all__ = ["TransformWithState"]
