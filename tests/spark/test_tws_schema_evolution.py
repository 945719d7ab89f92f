"""transformWithState state schema evolution, differentially: one query restarted on its
checkpoint with the processor's state schemas changed between runs, on Spark (the oracle)
and on arrowstate; every batch's rows (what the state held, as the new schemas read it)
and state figures must match, and what Spark refuses, arrowstate refuses with Spark's
error condition.

Spark's tests: test_schema_evolution_scenarios, test_schema_evolution_fails and
test_not_nullable_fails (python/pyspark/sql/tests/pandas/streaming/
test_pandas_transform_with_state.py, and the Row-API file beside it): a value variable's
fields added, removed, reordered and widened (int to long) with
spark.sql.streaming.stateStore.encodingFormat=avro. Here the same steps also change a list
variable's elements and a map variable's values (and rename a map key's field, which Spark
allows: keys match by position), and a run with Spark's default encoding (unsaferow)
renames fields, which that encoding reads by position.
"""
import json

import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.errors import StreamingQueryException
from pyspark.sql.types import _parse_datatype_string

import tws_evolution_processors as procs
from harness import assert_runs_same, assert_state_reads_same, run_query, spark_errors

cloudpickle.register_pickle_by_value(procs)

NODE = "ArrowTransformWithState"
SCHEMA = pa.schema([("id", pa.string()), ("temperature", pa.int32())])
BATCH = [{"id": "0", "temperature": 1}, {"id": "1", "temperature": 2},
         {"id": "1", "temperature": 3}]
OUTPUT = "id string, seen string"


def stage(value, element, map_key, map_value):
    """A run's state schemas, as DDL (made StructType JSON where a session parses them)."""
    return {"value": value, "list": element, "map_key": map_key, "map_value": map_value}


BASIC = stage("id int, name string", "n int", "k string", "v float")
ADD_FIELDS = stage("id int, name string, count int, active boolean, score float",
                   "n int, tag string", "k string", "v float, w int")
REMOVE_FIELDS = stage("id int, name string, score float", "n int", "k string", "w int")
REORDER = stage("score float, name string, id int", "n int", "key string", "w int")
UPCAST = stage("score double, name string, id long", "n long", "key string", "w long")
DOWNCAST = stage("score double, name string, id int", "n long", "key string", "w long")
NOT_NULLABLE = stage("id int not null, name string", "n int", "k string", "v float")
RENAMED = stage("ident int, label string", "m int", "k string", "x float")


@pytest.fixture(autouse=True)
def rocksdb(spark_conf):
    spark_conf(**{"spark.sql.streaming.stateStore.providerClass":
                  "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
                  "spark.sql.shuffle.partitions": 2})


def staged_run(spark, tmp_path, stages, api, arrowstate):
    """One query over one batch per stage, restarted before each later stage with that
    stage's processor."""
    at = {"stage": 0}
    stages = [{name: _parse_datatype_string(ddl).json() for name, ddl in s.items()}
              for s in stages]

    def build(df):
        processor = procs.EvolvingProcessor(stages[at["stage"]], pandas=api == "pandas")
        grouped = df.groupBy("id")
        run = (grouped.transformWithStateInPandas if api == "pandas"
               else grouped.transformWithState)
        return run(statefulProcessor=processor, outputStructType=OUTPUT,
                   outputMode="Update", timeMode="None")

    def next_stage(i, _checkpoint):
        at["stage"] = i + 1
        return False

    return run_query(spark, str(tmp_path), SCHEMA, [BATCH] * len(stages), build,
                     arrowstate=arrowstate, output_mode="update",
                     restart_after=range(len(stages) - 1), on_restart=next_stage)


def seen(run, batch):
    return {row[0]: json.loads(row[1]) for row in run.outputs[batch]}


# both APIs read state through one codec: the Row API's run is the refusal test's
@pytest.mark.parametrize("api", ["pandas"])
def test_fields_added_removed_reordered_and_widened(spark, spark_conf, tmp_path, api):
    spark_conf(**{"spark.sql.streaming.stateStore.encodingFormat": "avro"})
    stages = [BASIC, ADD_FIELDS, REMOVE_FIELDS, REORDER, UPCAST]
    native = staged_run(spark, tmp_path, stages, api, arrowstate=False)
    ours = staged_run(spark, tmp_path, stages, api, arrowstate=True)
    assert_runs_same(native, ours, NODE)
    # Spark's state readers: the same rows of every stage's state
    assert_state_reads_same(spark, native, ours, [1, 2, 4], ["value", "list", "map"])
    # Spark's own expectations (test_schema_evolution_scenarios): added fields read as
    # null, removed ones are gone, fields match by name, an int reads as a long. Key "0"'s
    # run writes field i of its schema as 10 + i (EvolvingProcessor's _fill, seed 1).
    assert seen(native, 1)["0"]["value"] == [10, "name-11", None, None, None]
    assert seen(native, 3)["0"]["value"] == [12.5, "name-11", 10]   # (id, name, score) by name
    assert seen(native, 4)["0"]["value"] == [10.5, "name-11", 12]   # float and int widened
    assert seen(native, 4)["0"]["list"] == [[10]] * 4
    # a map key's field renamed: the keys written before read by position
    assert seen(native, 4)["0"]["map"] == [[["k-10"], [10]], [["key-10"], [10]]]


# what Spark refuses is refused when the driver plans the run, the same for both APIs
@pytest.mark.parametrize("api", ["pandas"])
def test_a_narrowed_type_is_refused_as_spark_refuses_it(spark, spark_conf, tmp_path, api):
    spark_conf(**{"spark.sql.streaming.stateStore.encodingFormat": "avro"})
    errors = []
    for arrowstate in (False, True):
        with pytest.raises(StreamingQueryException) as failed:
            staged_run(spark, tmp_path, [BASIC, UPCAST, DOWNCAST], api, arrowstate)
        errors.append(spark_errors(failed.value))
    assert "STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION" in errors[0]
    assert set(errors[1]) == set(errors[0])


@pytest.mark.parametrize("api", ["rows"])
def test_a_not_nullable_field_is_refused_as_spark_refuses_it(spark, spark_conf, tmp_path,
                                                            api):
    spark_conf(**{"spark.sql.streaming.stateStore.encodingFormat": "avro"})
    errors = []
    for arrowstate in (False, True):
        with pytest.raises(StreamingQueryException) as failed:
            staged_run(spark, tmp_path, [NOT_NULLABLE], api, arrowstate)
        errors.append(spark_errors(failed.value))
    assert "TRANSFORM_WITH_STATE_SCHEMA_MUST_BE_NULLABLE" in errors[0]
    assert set(errors[1]) == set(errors[0])


def test_unsaferow_reads_renamed_fields_by_position(spark, tmp_path):
    native = staged_run(spark, tmp_path, [BASIC, RENAMED], "pandas", arrowstate=False)
    ours = staged_run(spark, tmp_path, [BASIC, RENAMED], "pandas", arrowstate=True)
    assert_runs_same(native, ours, NODE)
    assert seen(native, 1)["0"]["value"] == [10, "name-11"]   # (id, name) by position


def test_unsaferow_refuses_an_added_field_as_spark_does(spark, tmp_path):
    errors = []
    for arrowstate in (False, True):
        with pytest.raises(StreamingQueryException) as failed:
            staged_run(spark, tmp_path, [BASIC, ADD_FIELDS], "pandas", arrowstate)
        errors.append(spark_errors(failed.value))
    assert "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE" in errors[0]
    assert set(errors[1]) == set(errors[0])
