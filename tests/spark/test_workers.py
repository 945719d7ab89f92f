"""Python state workers managed as Spark manages its own: liveness, a pool per SparkEnv,
state released when its query stops, idle workers stopped, a cap on the state one holds."""
import datetime as dt
import json
import os
import subprocess
import sys

import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException

import fmgws_functions as fns
from harness import TEST_JAR_ENV, run_query, spark_errors
from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(fns)

EVENTS = pa.schema([("user", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))])


def ev(user, second):
    return {"user": user, "ts": dt.datetime.fromtimestamp(second, dt.timezone.utc)}


def seen_by_app(name: str, test_jar: str) -> dict:
    """Runs tests/<name> in a process of its own, its Spark set up as the tests' own
    (harness.quick_local); what it saw (its last JSON line)."""
    app = os.path.join(os.path.dirname(__file__), "..", "helpers", name)
    done = subprocess.run([sys.executable, app], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, **{TEST_JAR_ENV: test_jar}))
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-5000:]
    seen = json.loads(lines[-1])
    return seen


@pytest.mark.slow
def test_dead_workers_new_sessions_and_memory_after_stop(test_jar):
    seen = seen_by_app("worker_app.py", test_jar)
    assert seen["killed"] and seen["dead_worker_same_outputs"], seen
    assert seen["reloaded_after_kill"] > 0, seen
    assert seen["new_session_same_outputs"], seen
    assert seen["workers_after_spark_stop"] == 0, seen
    # spark.executor.pyspark.memory=6g: the function's process is limited as natively
    assert seen["memory_limits_arrowstate"] == seen["memory_limits_native"] == [6 << 30], seen
    # 400K keys held after the query's last batch (about 40 MB beyond the workers' fresh
    # size); dropped and the workers stopped after
    assert seen["held_after_stop_mb"] > 20, seen
    assert seen["workers_left"] == 0 and seen["rss_later_mb"] == 0, seen
    # the JVM killed: the idle worker and the one inside a function both exit
    assert seen["function_running_at_kill"] and seen["workers_at_kill"] >= 2, seen
    assert seen["workers_alive_after_kill"] == [], seen


def test_state_cap_fails_the_task_naming_query_operator_and_setting(spark, spark_conf,
                                                                    tmp_path):
    spark_conf(**{"spark.arrowstate.worker.maxStateBytes": 2000})
    batches = [[ev(f"user-{i}", i) for i in range(500)]]
    with pytest.raises(StreamingQueryException) as failure:
        run_query(spark, str(tmp_path), EVENTS, batches,
                  lambda df: df.dropDuplicates(["user"]), arrowstate=True)
    message = str(failure.value)
    assert "spark.arrowstate.worker.maxStateBytes=2000" in message
    error = spark_errors(failure.value)["ARROWSTATE_STATE_CAP_EXCEEDED"]
    assert error["sqlState"] == "53200"
    assert error["parameters"]["cap"] == "2000" and error["parameters"]["operatorId"] == "0"
    assert int(error["parameters"]["bytes"]) > 2000 and error["parameters"]["queryRunId"]


def test_worker_memory_is_reported(spark, tmp_path):
    run = run_query(spark, str(tmp_path), EVENTS, [[ev("a", 1)], [ev("b", 2)]],
                    lambda df: df.dropDuplicates(["user"]), arrowstate=True,
                    custom_metrics=["pythonWorkerRssBytes"])
    assert all(c[0]["pythonWorkerRssBytes"] > 10 * 2**20 for c in run.custom.values())


def test_a_users_function_never_shares_a_process_with_another_querys_state(spark, tmp_path):
    from pyspark.sql.streaming.state import GroupStateTimeout

    secrets = [[ev(f"secret-{i}", i) for i in range(20)]]
    kept = run_query(spark, str(tmp_path), EVENTS, secrets,
                     lambda df: df.dropDuplicates(["user"]), arrowstate=True)
    assert len(kept.outputs[0]) == 20   # its state stays loaded in the shared workers
    peek = run_query(
        spark, str(tmp_path), EVENTS, [[ev("b", 1), ev("c", 2)], [ev("b", 3)]],
        lambda df: df.groupBy("user").applyInPandasWithState(
            fns.looks_for_other_queries_state, "user string, foreign long", "n long", "Update",
            GroupStateTimeout.NoTimeout),
        arrowstate=True, output_mode="update")
    rows = [r for rows in peek.outputs.values() for r in rows]
    assert rows and all(r[1] == 0 for r in rows), rows
    assert all("ArrowFlatMapGroupsWithState" in p for p in peek.plans)
