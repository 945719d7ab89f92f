"""The JVM half of the contract: the shim reads the same contract.json as Python."""
import json

import pytest
from py4j.protocol import Py4JJavaError

from arrowstate import contract


def _jvm_contract(spark):
    return spark._jvm.org.apache.spark.sql.arrowstate.Contract


def test_the_shim_sees_the_same_contract(spark):
    seen = json.loads(_jvm_contract(spark).describe())
    assert seen["protocolVersion"] == contract.PROTOCOL_VERSION
    assert seen["frames"] == contract.FRAMES
    assert seen["deltaSuffix"] == contract.FILES["deltaSuffix"]
    assert seen["snapshotSuffix"] == contract.FILES["snapshotSuffix"]
    assert seen["families"] == sorted(contract.FAMILIES)
    assert seen["metrics"] == list(contract.METRICS)
    assert seen["settings"] == sorted(contract.SETTINGS)


def test_a_metric_the_contract_does_not_declare_fails_on_the_jvm(spark):
    metrics = spark._jvm.org.apache.spark.sql.arrowstate.WorkerMetrics
    parsed = metrics.parse('{"numDroppedDuplicateRows": 2}', "deduplicate")
    assert parsed.apply("numDroppedDuplicateRows") == 2
    with pytest.raises(Py4JJavaError, match="rowsSeen"):
        metrics.parse('{"rowsSeen": 1}', "deduplicate")
    with pytest.raises(Py4JJavaError, match="numDroppedDuplicateRows"):
        metrics.parse('{"numDroppedDuplicateRows": 1}', "aggregate")
