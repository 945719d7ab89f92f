"""The environment Spark promises Python functions, inside applyInPandasWithState functions
that arrowstate runs: the same as native Spark gives them."""
import datetime as dt

import pyarrow as pa
from pyspark import cloudpickle
from pyspark.sql.streaming.state import GroupStateTimeout

import fmgws_functions as fns
from harness import assert_same

cloudpickle.register_pickle_by_value(fns)

EVENTS = pa.schema([("user", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))])


def ev(user, second):
    return {"user": user, "ts": dt.datetime.fromtimestamp(second, dt.timezone.utc)}


def test_task_context_executor_env_and_shipped_modules(spark, tmp_path):
    module = tmp_path / "arrowstate_shipped_module.py"
    module.write_text('VALUE = "shipped with addPyFile"\n')
    spark.sparkContext.addPyFile(str(module))
    spark.sparkContext.setLocalProperty("arrowstate.test.prop", "a local property")
    try:
        _, ours = assert_same(
            spark, tmp_path, EVENTS, [[ev("a", 1), ev("b", 2)], [ev("c", 3), ev("a", 4)]],
            lambda df: df.groupBy("user").applyInPandasWithState(
                fns.reports_its_environment,
                "user string, partition int, attempt int, stage_known boolean, prop string, "
                "env string, shipped string", "n long", "Update",
                GroupStateTimeout.NoTimeout),
            expect_node="ArrowFlatMapGroupsWithState", output_mode="update")
    finally:
        spark.sparkContext.setLocalProperty("arrowstate.test.prop", None)
    rows = [r for rows in ours.outputs.values() for r in rows]
    assert rows and all(r[3] and r[4] == "a local property" and r[5] == "from-executorEnv"
                        and r[6] == "shipped with addPyFile" for r in rows), rows


def test_spark_and_arrowstate_workers_run_one_interpreter(spark, tmp_path):
    """configure() makes Spark's own Python workers, a function's worker and the state
    workers start the same interpreter."""
    import sys

    import pandas as pd
    from pyspark.sql.functions import pandas_udf

    from harness import run_query
    from procinfo import own_state_worker_pids

    @pandas_udf("string")
    def interpreter(ids: pd.Series) -> pd.Series:
        import sys as worker_sys
        return pd.Series([worker_sys.executable] * len(ids))

    sparks = spark.range(1).select(interpreter("id")).first()[0]
    run = run_query(spark, str(tmp_path), EVENTS, [[ev("a", 1)]],
                    lambda df: df.groupBy("user").applyInPandasWithState(
                        fns.reports_its_interpreter, "user string, python string", "n long",
                        "Update", GroupStateTimeout.NoTimeout),
                    arrowstate=True, output_mode="update")
    functions = {r[1] for rows in run.outputs.values() for r in rows}
    run_query(spark, str(tmp_path), EVENTS, [[ev("a", 1)]],
              lambda df: df.dropDuplicates(["user"]), arrowstate=True)
    states = set()
    for pid in own_state_worker_pids():
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            states.add(f.read().split(b"\0")[0].decode())
    assert functions == {sparks} and states == {sys.executable} and sparks == sys.executable
