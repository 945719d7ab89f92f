"""bench.py --state-ops: what one state operation of a transformWithState processor costs
inside the worker, without Spark, beside the same operation on the floor's state (a dict
per variable, bench_lib/floor.py): the floor's figure is what the interpreter takes for the
call and a dict or list operation, so arrowstate's distance to it does not move with the
machine's speed as the microseconds do."""
from __future__ import annotations

import json
import statistics
import time

import pyarrow as pa


def _timed_state_operations():
    """A transformWithState processor that times its own state operations (one key)."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class TimesOperations(StatefulProcessor):
        def init(self, handle):   # StructTypes: without Spark nobody parses DDL strings
            from pyspark.sql.types import LongType, StructField, StructType
            n, k = (StructType([StructField(c, LongType())]) for c in "nk")
            self.value = handle.getValueState("value", n)
            self.list = handle.getListState("list", n)
            self.map = handle.getMapState("map", k, n)

        def handleInputRows(self, key, rows, timerValues):
            import pandas as pd
            timings = _timed(self.value, self.list, self.map)
            self.list.clear()
            self.map.clear()
            yield pd.DataFrame({"op": [t[0] for t in timings], "us": [t[1] for t in timings]})
    return TimesOperations()


def _timed(value, items, entries, n: int = 100_000) -> list[tuple[str, float]]:
    """Microseconds per operation of 100,000 of each on these state objects (one key)."""
    value.update((0,))
    ops = {"ValueState.get": lambda i: value.get(),
           "ValueState.exists": lambda i: value.exists(),
           "ValueState.update": lambda i: value.update((i,)),
           "ListState.appendValue": lambda i: items.appendValue((i,)),
           "MapState.updateValue": lambda i: entries.updateValue((i % 100,), (i,)),
           "MapState.getValue": lambda i: entries.getValue((i % 100,))}
    empty = time.perf_counter()
    for i in range(n):
        (lambda i: None)(i)
    empty = time.perf_counter() - empty   # the loop and call, taken off
    timings = []
    for name, op in ops.items():
        start = time.perf_counter()
        for i in range(n):
            op(i)
        timings.append((name, (time.perf_counter() - start - empty) / n * 1e6))
    return timings


def _floor_timings() -> list[tuple[str, float]]:
    """_timed on the floor's state objects (bench_lib/floor.py: dicts, no engine)."""
    from bench_lib.floor import _Handle
    handle = _Handle()
    handle.key = ("a",)
    return _timed(handle.getValueState("value", None), handle.getListState("list", None),
                  handle.getMapState("map", None, None))


def state_ops(args) -> None:
    """What one state operation of a transformWithState processor costs inside the worker
    (no Spark): the worker's family runs a processor that times 100,000 of each operation
    on one key; medians of --runs."""
    import base64

    from pyspark.serializers import CloudPickleSerializer
    from pyspark.sql.streaming.stateful_processor_util import (
        TransformWithStateInPandasUdfUtils)

    from arrowstate.families import TransformWithState
    from arrowstate.store.versions.versioned import VersionedState

    schema = pa.schema([("k", pa.string()), ("k_", pa.string())])
    udf = TransformWithStateInPandasUdfUtils(_timed_state_operations(),
                                             "None").transformWithStateUDF
    operator = {"command": base64.b64encode(CloudPickleSerializer().dumps((udf, None))).decode(),
                "pythonIncludes": [], "keyIndices": [0], "valueIndices": [1], "pandas": True,
                "maxRecordsPerBatch": 10000, "variables": {}, "timeMode": "None",
                "runnerConf": {"spark.sql.session.timeZone": "UTC"},
                "outputSchema": '{"type":"struct","fields":[{"name":"op","type":"string",'
                                '"nullable":true,"metadata":{}},{"name":"us","type":"double",'
                                '"nullable":true,"metadata":{}}]}'}
    runs: dict[str, list[float]] = {}
    floor: dict[str, list[float]] = {}
    for _ in range(args.runs):
        for op, us in _floor_timings():
            floor.setdefault(op, []).append(us)
        family = TransformWithState(operator, schema)
        state = VersionedState(family.key_fields, family.value_fields, named_columns=True)
        family.process(state, pa.RecordBatch.from_arrays([pa.array(["a"]), pa.array(["a"])],
                                                         schema=schema))
        for batch in family.finish(state):
            for row in batch.to_pylist():
                runs.setdefault(row["op"], []).append(row["us"])
    ours = {op: statistics.median(t) for op, t in runs.items()}
    floors = {op: statistics.median(t) for op, t in floor.items()}
    print(json.dumps({"case": "state_ops", "runs": args.runs,
                      "us_per_operation_median": {op: round(t, 3) for op, t in ours.items()},
                      "floor_us_per_operation_median": {op: round(t, 3)
                                                        for op, t in floors.items()},
                      "excess_over_floor_us": {op: round(t - floors[op], 3)
                                               for op, t in ours.items()}}), flush=True)
