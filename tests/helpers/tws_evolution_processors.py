"""A stateful processor whose state schemas change between runs of one query, for the
state schema evolution tests (tests/spark/test_tws_schema_evolution.py): the scenarios of
Spark's test_schema_evolution_scenarios, test_schema_evolution_fails and
test_not_nullable_fails (python/pyspark/sql/tests/pandas/streaming/
test_pandas_transform_with_state.py and the Row-API file beside it), widened to list and
map state.

Each run declares a value, a list and a map variable in the schemas of its stage; per key
it reports what the state held when the batch began (as JSON, so that any schema compares),
then writes the key's state in the stage's schemas. Serves both APIs; pickled by value.
"""
import json

import pandas as pd
from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import StatefulProcessor
from pyspark.sql.types import StructType


def _schema(text: str) -> StructType:
    return StructType.fromJson(json.loads(text))


def _plain(value):
    """A state value as JSON can hold it (a Row as its values, in its fields' order)."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return sorted([_plain(k), _plain(v)] for k, v in value.items())
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return round(value, 4)   # a float widened to double shows its float digits
    return value


def _fill(schema: StructType, seed: int) -> tuple:
    """A value of `schema` made from `seed`: every type the stages use."""
    out = []
    for i, f in enumerate(schema.fields):
        t = f.dataType.typeName()
        n = seed * 10 + i
        out.append({"integer": n, "long": n * 1_000_003, "short": n % 300, "float": n + 0.5,
                    "double": n + 0.25, "string": f"{f.name}-{n}", "boolean": n % 2 == 0,
                    "struct": _fill(f.dataType, seed) if t == "struct" else None,
                    "array": [n, n + 1] if t == "array" else None,
                    }[t])
    return tuple(out)


class EvolvingProcessor(StatefulProcessor):
    """`stage`: the schemas (StructType JSON) of "value", "list" (an element), "map_key" and
    "map_value"."""

    def __init__(self, stage: dict, pandas: bool):
        self.stage, self.pandas = stage, pandas

    def init(self, handle):
        s = self.stage
        self.value = handle.getValueState("value", _schema(s["value"]))
        self.list = handle.getListState("list", _schema(s["list"]))
        self.map = handle.getMapState("map", _schema(s["map_key"]), _schema(s["map_value"]))

    def handleInputRows(self, key, rows, timerValues):
        count = sum(len(pdf) for pdf in rows) if self.pandas else sum(1 for _ in rows)
        seen = {"value": _plain(self.value.get()) if self.value.exists() else None,
                "list": [_plain(v) for v in self.list.get()] if self.list.exists() else None,
                "map": sorted([_plain(k), _plain(v)] for k, v in self.map.iterator())
                if self.map.exists() else None}
        seed = int(key[0]) + count
        self.value.update(_fill(_schema(self.stage["value"]), seed))
        self.list.appendValue(_fill(_schema(self.stage["list"]), seed))
        self.map.updateValue(_fill(_schema(self.stage["map_key"]), seed % 2),
                             _fill(_schema(self.stage["map_value"]), seed))
        text = json.dumps(seen, sort_keys=True)
        if self.pandas:
            yield pd.DataFrame({"id": [key[0]], "seen": [text]})
        else:
            yield Row(id=key[0], seen=text)

    def close(self):
        """Nothing to release: the state is the engine's."""
