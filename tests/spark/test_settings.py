"""`spark.arrowstate.*` settings refuse what their type does not take: the query fails when
its micro-batch is planned, with Spark's INVALID_CONF_VALUE naming the setting, before
anything is switched off or converted; strict mode's failure carries its own condition.
(tests/jvm/unit/SettingsTests.scala covers each type's parsing without Spark.)"""
import datetime as dt
import hashlib
import os

import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from harness import run_query, spark_errors

EVENTS = pa.schema([("user", pa.string()), ("ts", pa.timestamp("us", tz="UTC")),
                    ("x", pa.float64())])
ENABLED = "spark.arrowstate.enabled"


def ev(user, second, x=0.5):
    return {"user": user, "ts": dt.datetime.fromtimestamp(second, dt.timezone.utc), "x": x}


BATCHES = [[ev("a", 1), ev("b", 2), ev("a", 3)], [ev("c", 4), ev("a", 5)]]


def dedup(df):
    return df.dropDuplicates(["user"])


def _files(root: str) -> dict[str, str]:
    """Every file under `root` by its path there: its content's digest."""
    found = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return found


def _refused(failure, condition: str, key: str, value: str) -> dict:
    errors = spark_errors(failure.value)
    assert condition in errors, (errors, str(failure.value))
    error = errors[condition]
    assert error["sqlState"] == "22022"
    assert (error["parameters"]["confName"], error["parameters"]["confValue"]) == (key, value)
    return error["parameters"]


@pytest.mark.local_checkpoints
def test_enabled_yes_fails_at_planning_and_leaves_the_checkpoint_alone(spark, tmp_path):
    """`yes` once read as false: arrowstate switched off and converted the state arrowstate
    wrote to Spark's store at planning. Now the restarted query fails, its state as it was."""
    seen = {}

    def restart_with_yes(_, checkpoint):
        seen["state"] = _files(os.path.join(checkpoint, "state"))
        seen["commits"] = sorted(os.listdir(os.path.join(checkpoint, "commits")))
        spark.conf.set(ENABLED, "yes")

    with pytest.raises(StreamingQueryException) as failure:
        run_query(spark, str(tmp_path), EVENTS, BATCHES, dedup, arrowstate=True,
                  restart_after=[0], on_restart=restart_with_yes)
    parameters = _refused(failure, "INVALID_CONF_VALUE.TYPE_MISMATCH", ENABLED, "yes")
    assert parameters["confType"] == "boolean"
    assert ENABLED in str(failure.value) and "'yes'" in str(failure.value)
    checkpoint = next(p for p in tmp_path.glob("run*-on/ck"))
    assert any(name.endswith(".arrowstate.delta") for name in seen["state"]), seen["state"]
    assert _files(str(checkpoint / "state")) == seen["state"]
    assert sorted(os.listdir(checkpoint / "commits")) == seen["commits"]


def test_booleans_take_true_and_false_in_any_case(spark, spark_conf, tmp_path):
    """A running query has its own copy of the session's settings: they are changed while it
    is stopped (run_query sets spark.arrowstate.enabled itself when it starts)."""
    family = "spark.arrowstate.deduplicate.enabled"
    spark_conf(**{family: "False"})
    off = run_query(spark, str(tmp_path), EVENTS, BATCHES, dedup, arrowstate=True,
                    restart_after=[0], on_restart=lambda *_: spark.conf.set(ENABLED, "FALSE"))
    first, restarted = off.plans
    assert f"ArrowStateFallback [reason: {family}=false]" in first, first
    assert "StreamingDeduplicate" in restarted and "Arrow" not in restarted.split(
        "== Extended Information")[0], restarted
    spark_conf(**{family: "tRUE"})
    on = run_query(spark, str(tmp_path), EVENTS, BATCHES, dedup, arrowstate=True,
                   restart_after=[0], on_restart=lambda *_: spark.conf.set(ENABLED, "True"))
    assert len(on.plans) == 2 and all("ArrowStreamingDeduplicate" in p for p in on.plans), (
        on.plans)


@pytest.mark.parametrize("key, value, condition", [
    ("spark.arrowstate.fallback.strict", "ture", "INVALID_CONF_VALUE.TYPE_MISMATCH"),
    ("spark.arrowstate.worker.affinityWaitMs", "10s", "INVALID_CONF_VALUE.TYPE_MISMATCH"),
    ("spark.arrowstate.worker.stateMemoryPercent", "150", "INVALID_CONF_VALUE.REQUIREMENT"),
    ("spark.arrowstate.worker.memory", "lots", "INVALID_CONF_VALUE.TYPE_MISMATCH"),
], ids=["boolean", "integer", "integer-bounds", "size"])
@pytest.mark.local_checkpoints
def test_a_bad_value_fails_the_query_naming_the_setting(spark, spark_conf, tmp_path, key,
                                                        value, condition):
    spark_conf(**{key: value})
    with pytest.raises(StreamingQueryException) as failure:
        run_query(spark, str(tmp_path), EVENTS, BATCHES, dedup, arrowstate=True)
    parameters = _refused(failure, condition, key, value)
    if condition.endswith("REQUIREMENT"):
        assert "between 0 and 100" in parameters["confRequirement"]
    checkpoint = next(p for p in tmp_path.glob("run*-on/ck"))
    assert not os.listdir(checkpoint / "commits")


def test_a_query_without_state_reads_no_setting(spark, spark_conf):
    spark_conf(**{ENABLED: "yes"})
    assert spark.range(3).groupBy().count().first()[0] == 3


def test_strict_mode_fails_with_its_condition(spark, spark_conf, tmp_path):
    spark_conf(**{"spark.arrowstate.fallback.strict": "TRUE"})
    with pytest.raises(StreamingQueryException) as failure:
        run_query(spark, str(tmp_path), EVENTS, BATCHES,
                  lambda df: df.groupBy(F.array("x")).count(),
                  arrowstate=True, output_mode="update")
    errors = spark_errors(failure.value)
    assert "ARROWSTATE_FALLBACK_STRICT" in errors, (errors, str(failure.value))
    error = errors["ARROWSTATE_FALLBACK_STRICT"]
    assert error["sqlState"] == "0A000"
    assert set(error["parameters"]) == {"operator", "reasons"}
    assert "ARRAY<DOUBLE>" in error["parameters"]["reasons"], error
    assert "[ARROWSTATE_FALLBACK_STRICT]" in str(failure.value)
