"""contract.json is the one declaration both halves read: the Python half and the README
must agree with it (tests/spark/test_contract_jvm.py checks the JVM half)."""
import json
import os

import pytest

from arrowstate import contract, protocol

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def test_readme_settings_and_metrics_tables_are_the_declared_ones():
    with open(README, encoding="utf-8") as f:
        text = f.read()
    assert contract.settings_table() in text, (
        "README's settings table differs from contract.json; paste "
        "`python -c 'import arrowstate.contract as c; print(c.settings_table())'`")
    assert contract.metrics_table() in text, (
        "README's metrics table differs from contract.json; paste "
        "`python -c 'import arrowstate.contract as c; print(c.metrics_table())'`")


def test_protocol_tags_come_from_the_contract():
    for name, tag in contract.FRAMES.items():
        assert getattr(protocol, name) == tag
    assert protocol.VERSION == contract.PROTOCOL_VERSION
    assert len(set(contract.FRAMES.values())) == len(contract.FRAMES)


def test_an_undeclared_metric_fails():
    contract.check_reported("deduplicate", {"numDroppedDuplicateRows": 1})
    with pytest.raises(RuntimeError, match="numDroppedDuplicateRows"):
        contract.check_reported("aggregate", {"numDroppedDuplicateRows": 1})
    with pytest.raises(RuntimeError, match="rowsSeen"):
        contract.check_reported("aggregate", {"rowsSeen": 1})


def test_every_declared_entry_is_complete():
    for m in contract.METRICS.values():
        assert m["kind"] in ("sum", "timing", "size") and m["description"]
        assert m["reportedBy"] in ("python", "jvm", "both") and m["owner"] in (
            "spark", "arrowstate")
        assert set(m.get("families", [])) <= set(contract.FAMILIES)
    for s in contract.SETTINGS.values():
        assert s["key"].startswith("spark.arrowstate.") and s["scope"] in ("session", "startup")
    for f in contract.FAMILIES.values():
        assert f["switch"] in contract.SETTINGS
    with open(os.path.join(os.path.dirname(contract.__file__), "contract.json")) as f:
        json.load(f)
