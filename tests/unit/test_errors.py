"""Errors carry a condition Spark's tools understand: Spark's own where Spark has one (in
its registry), else arrowstate's, declared in contract.json; the ERROR frame carries the
condition, parameters, message and traceback."""
import glob
import json
import os
import re
import zipfile

import pytest
from pyspark.errors import PySparkValueError

import arrowstate
from arrowstate import contract, errors
from arrowstate.contract import ERRORS
from arrowstate.families.group_state_values import StateValueError
from arrowstate.store.formats.container import CorruptStateFile

PACKAGE = os.path.dirname(arrowstate.__file__)
SHIM = os.path.join(os.path.dirname(__file__), "..", "..", "jvm-shim", "src", "main", "scala")


def source_paths():
    """Both halves' sources: conditions are raised on either side."""
    return (glob.glob(os.path.join(PACKAGE, "**", "*.py"), recursive=True)
            + glob.glob(os.path.join(SHIM, "**", "*.scala"), recursive=True))


def sparks_conditions() -> set[str]:
    """Spark's registry of error conditions (main and sub), from the jar pyspark ships."""
    import pyspark

    jar = glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars",
                                 "spark-common-utils_*.jar"))[0]
    with zipfile.ZipFile(jar) as z:
        registry = json.loads(z.read("error/error-conditions.json"))
    return set(registry) | {f"{main}.{sub}" for main, spec in registry.items()
                            for sub in spec.get("subClass", {})}


def frame_of(error):
    try:
        raise error
    except Exception as e:   # noqa: BLE001 - any error makes a frame
        payload = errors.error_payload(e)
        contract.check_payload("error", payload)   # what the ERROR frame may carry
        return payload


def test_an_error_of_ours_crosses_with_its_condition_parameters_and_traceback():
    frame = frame_of(CorruptStateFile("/ck/state/0/1/2.arrowstate.delta",
                                      "operator 0, partition 1, version 2", "truncated"))
    assert frame["condition"] == "CANNOT_LOAD_STATE_STORE.CORRUPT_STATE_FILE"
    assert frame["parameters"] == {"path": "/ck/state/0/1/2.arrowstate.delta",
                                   "context": "operator 0, partition 1, version 2",
                                   "reason": "truncated"}
    assert frame["message"].startswith("An error occurred during loading state")
    assert "Traceback" in frame["traceback"] and "frame_of" in frame["traceback"]


def test_pysparks_own_and_any_other_error_keep_what_they_say():
    pyspark_error = frame_of(PySparkValueError(errorClass="CANNOT_BE_NONE",
                                               messageParameters={"arg_name": "key"}))
    assert pyspark_error["condition"] == "CANNOT_BE_NONE"
    assert pyspark_error["parameters"] == {"arg_name": "key"}
    other = frame_of(KeyError("user"))
    assert other["condition"] == errors.PYTHON_ERROR
    assert other["parameters"] == {"errorType": "KeyError"}
    assert other["message"] == "KeyError: 'user'"


def test_state_value_errors_name_sparks_condition_where_spark_has_one():
    assert StateValueError("no Java form").condition == "ARROWSTATE_STATE_VALUE_NOT_STORABLE"
    assert str(StateValueError("p 40", "DECIMAL_PRECISION_EXCEEDS_MAX_PRECISION")) == \
        "[DECIMAL_PRECISION_EXCEEDS_MAX_PRECISION] p 40"


def test_every_condition_is_sparks_or_declared_and_ours_are_not_sparks():
    spark = sparks_conditions()
    used, environment = set(), set()
    for path in source_paths():
        with open(path, encoding="utf-8") as f:
            text = f.read()
        used |= set(re.findall(r'"((?:[A-Z][A-Z0-9]*_)+[A-Z0-9]+(?:\.[A-Z_]+)?)"', text))
        environment |= set(re.findall(r'environ(?:\.get\(|\[)"([A-Z_]+)"', text))
        environment |= set(re.findall(r'"([A-Z_]+)" -> ', text))   # the shim's env maps
    conditions = {c for c in used - environment
                  if c in spark or c in ERRORS or c.startswith("ARROWSTATE_") or "." in c}
    undeclared = sorted(c for c in conditions if c not in spark and c not in ERRORS)
    assert not undeclared, undeclared
    assert "CANNOT_LOAD_STATE_STORE.CANNOT_READ_DELTA_FILE_NOT_EXISTS" in conditions
    for condition, spec in ERRORS.items():
        assert condition not in spark, f"{condition} is Spark's own: do not redeclare it"
        assert re.fullmatch(r"[0-9A-Z]{5}", spec["sqlState"]), condition


@pytest.mark.parametrize("condition", sorted(ERRORS))
def test_declared_conditions_are_raised_somewhere(condition):
    sources = "".join(open(p, encoding="utf-8").read() for p in source_paths())
    assert f'"{condition}"' in sources or condition in (errors.PYTHON_ERROR,
                                                        errors.FAILED_TO_START)
