"""Each family's layout object: registered for every family, implementing every operation,
declared in the contract; and the rows it lays out, to Spark's and back."""
import subprocess
import sys

import pyarrow as pa
import pytest

from arrowstate import contract
from arrowstate.families import REGISTRY
from arrowstate.spark_state.layout import SparkLayout
from arrowstate.spark_state.layouts import LAYOUTS, layout, layout_of_schema, missing

OPERATIONS = sorted(SparkLayout.__abstractmethods__)


def test_every_family_has_a_layout_implementing_every_operation_and_is_in_the_contract():
    assert {"spark_rows", "our_rows", "export_operator", "import_operator",
            "repartition_operator"} <= set(OPERATIONS)
    assert set(LAYOUTS) == set(REGISTRY) == set(contract.FAMILIES)
    assert missing(REGISTRY, LAYOUTS, contract.FAMILIES) == []
    names = []
    for name, family in REGISTRY.items():
        assert family.layout is LAYOUTS[name] is layout(name)
        for operation in OPERATIONS:
            assert getattr(type(family.layout), operation) is not getattr(SparkLayout, operation)
        names += contract.FAMILIES[name]["sparkMetadataNames"]
    assert len(names) == len(set(names)), "an operator name of Spark's names one family"


def test_a_missing_part_fails():
    class NoOurRows(SparkLayout):
        family = "noOurRows"

        def spark_rows(self, batch, key_schema, value_schema, column_family=None):
            return batch

        def export_operator(self, job):
            return []

        def import_operator(self, job):
            return []

        def repartition_operator(self, job):
            return []

    with pytest.raises(TypeError, match="our_rows"):   # a layout lacking an operation
        NoOurRows()

    class Bare:   # a family whose class names no layout
        name = "bare"

    lacks = missing({**REGISTRY, "bare": Bare}, LAYOUTS, contract.FAMILIES)
    assert lacks == ["bare: no layout object of its own registered under its name",
                     "bare: contract.json declares no sparkMetadataNames for it"]
    undeclared = {k: v for k, v in contract.FAMILIES.items() if k != "aggregate"}
    assert missing(REGISTRY, LAYOUTS, undeclared) == [
        "aggregate: contract.json declares no sparkMetadataNames for it"]
    assert missing({k: v for k, v in REGISTRY.items() if k != "aggregate"}, LAYOUTS,
                   contract.FAMILIES) == ["aggregate: a layout without a family"]
    with pytest.raises(ValueError, match="no family 'bare'"):
        layout("bare")


def test_the_offline_tools_load_no_live_family():
    """spark_state (the layouts and the state tools) loads no family module and no pandas:
    `python -m arrowstate state ...` needs pyarrow and numpy only (test_python_layers
    checks its imports; this, what a fresh interpreter loads)."""
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, arrowstate.spark_state; print(sorted(m for m in "
         "sys.modules if m.startswith('arrowstate.families') or m.split('.')[0] == 'pandas'))"],
        capture_output=True, text=True, timeout=120, check=True).stdout
    assert loaded.strip() == "[]"


KEY = {"type": "struct", "fields": [
    {"name": "a", "type": "string", "nullable": True, "metadata": {}},
    {"name": "b", "type": "long", "nullable": True, "metadata": {}}]}
GROUP = {"type": "struct", "fields": [{"name": "x", "type": "long", "nullable": True,
                                       "metadata": {}}]}


def _value(*fields):
    return {"type": "struct", "fields": [{"name": n, "type": t, "nullable": True,
                                          "metadata": {}} for n, t in fields]}


@pytest.mark.parametrize("family, value_schema, values", [
    ("deduplicate", _value(("__dummy__", "null")), []),
    ("deduplicate", _value(("expiresAtMicros", "long")), [pa.array([5, 6, 7], pa.int64())]),
    ("aggregate", _value(("sum", "long"), ("avg", "double")),
     [pa.array([5, 6, 7], pa.int64()), pa.array([1.0, None, 3.0])]),
    ("sessionWindow", _value(("count", "long")), [pa.array([1, 2, 3], pa.int64())]),
    ("flatMapGroupsWithState", _value(("groupState", GROUP), ("timeoutTimestamp", "long")),
     [pa.array([1, 2, None], pa.int64()), pa.array([True, True, False]),
      pa.array([-1, 10, -1], pa.int64())]),
])
def test_key_value_layouts_lay_rows_out_as_spark_and_back(family, value_schema, values):
    keys = [pa.array(["x", None, "z"]), pa.array([1, 2, None], pa.int64())]
    stored = pa.RecordBatch.from_arrays(
        keys + values, names=["k0", "k1"] + [f"v{i}" for i in range(len(values))])
    own = layout(family)
    spark = own.spark_rows(stored, KEY, value_schema)
    assert spark.schema.names == ["key", "value"]
    assert spark.column(0).type.names == ["a", "b"]
    assert spark.column(1).type.names == [f["name"] for f in value_schema["fields"]]
    if family == "flatMapGroupsWithState":   # an undefined state is Spark's null groupState
        assert spark.column(1).field(0).is_null().to_pylist() == [False, False, True]
    back = own.our_rows(spark, value_schema)
    if family == "flatMapGroupsWithState":   # the undefined state's fields are Spark's nulls
        assert back.column(2).to_pylist() == [1, 2, None]
        assert back.columns[3:] == stored.columns[3:]
    else:
        assert back.equals(stored)
    # the requests that carry schemas only find the same rows
    assert layout_of_schema(value_schema).spark_rows(stored, KEY, value_schema).equals(spark)
