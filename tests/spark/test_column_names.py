"""Columns cross between the JVM and Python by position, whatever they are called: keys,
values and state whose structs repeat a field name (as Spark's own suites group by nested
tuples), and names Arrow or Python would trip on (empty, dotted, arrowstate's own `__op`),
for every family, against native Spark."""
import datetime as dt
import sys

import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout
from pyspark.sql.streaming.stateful_processor import StatefulProcessor
from pyspark.sql.types import LongType, StructField, StructType

import fmgws_functions as fns
from harness import assert_same, run_query

cloudpickle.register_pickle_by_value(fns)
cloudpickle.register_pickle_by_value(sys.modules[__name__])   # its functions, to workers

EVENTS = pa.schema([("user", pa.string()), ("ts", pa.timestamp("us", tz="UTC")),
                    ("v", pa.int64())])


def ev(user, second, v=1):
    return {"user": user, "ts": dt.datetime.fromtimestamp(second, dt.timezone.utc), "v": v}


BATCHES = [[ev("a", 1), ev("b", 2, 5), ev("a", 3, 2)],
           [ev("a", 20, 4), ev("c", 21), ev("b", 22)],
           [ev("c", 40), ev("a", 41, 7)]]


def odd_key(df):
    """A key whose structs repeat field names, nested, beside names that are empty, dotted
    or arrowstate's own op column's (top-level names too, a `k` twice)."""
    u = F.col("user")
    return df.select(
        F.struct(F.struct(u.alias("s"), u.alias("s")).alias("s"), u.alias("s")).alias("k"),
        F.struct(u.alias(""), u.alias("a.b"), u.alias("__op")).alias("n"), "ts", "v")


def as_json(df):
    """Rows collected to Python go through Arrow, which refuses repeated names: the test
    collects each struct as JSON (the operators above still carry the structs)."""
    return df.select([F.to_json(c).alias(c) if isinstance(t, StructType) else F.col(c)
                      for c, t in zip(df.columns, (f.dataType for f in df.schema))])


def assert_state_reads_same(spark, native, ours):
    """Spark's `statestore` reader gives the same rows of both checkpoints."""
    def read(run):
        df = spark.read.format("statestore").load(run.checkpoint)
        return sorted(r[0] for r in df.select(F.to_json(F.struct("*"))).collect())
    assert read(ours) == read(native) != []


def test_deduplication(spark, tmp_path):
    runs = assert_same(
        spark, tmp_path, EVENTS, BATCHES,
        lambda df: as_json(odd_key(df).dropDuplicates(["k", "n"]).select("k", "n", "v")),
        expect_node="ArrowStreamingDeduplicate")
    assert_state_reads_same(spark, *runs)


def test_aggregation(spark, tmp_path):
    def build(df):
        d = odd_key(df)
        d = d.groupBy("k", "n").agg(
            F.count("*").alias("c"),
            # a buffer that is a struct with a repeated name
            F.max(F.struct(F.col("v").alias("x"), F.col("v").alias("x"))).alias("m"))
        return as_json(d)
    runs = assert_same(spark, tmp_path, EVENTS, BATCHES, build, output_mode="update",
                       expect_node="ArrowStateStoreSave")
    assert_state_reads_same(spark, *runs)


def test_session_window(spark, tmp_path):
    def build(df):
        return as_json(odd_key(df).withWatermark("ts", "10 seconds")
                       .groupBy(F.session_window("ts", "5 seconds"), "k", "n")
                       .agg(F.sum("v").alias("total")))
    runs = assert_same(spark, tmp_path, EVENTS, BATCHES, build,
                       expect_node="ArrowSessionWindowStateStoreSave")
    assert_state_reads_same(spark, *runs)


REPEATED = StructType([StructField("x", LongType()), StructField("x", LongType())])


def count_in_repeated_names(key, pdfs, state):
    """applyInPandasWithState: its key has structs with repeated names, its state too."""
    import pandas as pd

    n = (state.get[0][0] if state.exists else 0) + sum(len(p) for p in pdfs)
    state.update(((n, -n),))
    yield pd.DataFrame({"key": [str(key)], "n": [n]})


def test_apply_in_pandas_with_state(spark, tmp_path):
    def build(df):
        return df.groupBy("user").applyInPandasWithState(
            count_in_repeated_names, "key string, n long",
            StructType([StructField("s", REPEATED)]), "Update", GroupStateTimeout.NoTimeout)
    runs = assert_same(spark, tmp_path, EVENTS, BATCHES, build, output_mode="update",
                       expect_node="ArrowFlatMapGroupsWithState")
    assert_state_reads_same(spark, *runs)


def test_apply_in_pandas_with_state_refuses_repeated_names_as_spark_does(spark, tmp_path):
    """Spark's runner refuses input whose structs repeat a name (pandas would lose one of
    the fields); so does arrowstate's, with Spark's condition."""
    def build(df):
        return odd_key(df).groupBy("k", "n").applyInPandasWithState(
            count_in_repeated_names, "key string, n long",
            StructType([StructField("s", REPEATED)]), "Update", GroupStateTimeout.NoTimeout)
    for on in (False, True):
        with pytest.raises(StreamingQueryException,
                           match="DUPLICATED_FIELD_NAME_IN_ARROW_STRUCT"):
            run_query(spark, str(tmp_path), EVENTS, BATCHES, build, arrowstate=on,
                      output_mode="update")


class Nothing(StatefulProcessor):
    def init(self, handle):
        self.value = handle.getValueState("value", "n long")

    def handleInputRows(self, key, rows, timerValues):
        yield from ()


class RepeatedNamesInState(Nothing):
    def init(self, handle):
        self.value = handle.getValueState("value", StructType([StructField("s", REPEATED)]))


@pytest.mark.parametrize("where,processor,message", [
    # Spark's runner refuses input whose structs repeat a name (the function would lose one)
    ("input", Nothing, "DUPLICATED_FIELD_NAME_IN_ARROW_STRUCT"),
    # Spark keeps a state variable's schema as an Avro record, which refuses one
    ("state", RepeatedNamesInState, "Duplicate field x in record s")])
def test_transform_with_state_refuses_repeated_names_as_spark_does(
        spark, spark_conf, tmp_path, where, processor, message):
    spark_conf(**{"spark.sql.streaming.stateStore.providerClass":
                  "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"})

    def build(df):
        if where == "input":
            df = df.select("user", F.struct(F.col("v").alias("x"), F.col("v").alias("x")))
        return df.groupBy("user").transformWithStateInPandas(
            processor(), "user string", "Update", "None")
    for on in (False, True):
        with pytest.raises(StreamingQueryException, match=message):
            run_query(spark, str(tmp_path), EVENTS, BATCHES, build, arrowstate=on,
                      output_mode="update")
