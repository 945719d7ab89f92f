"""Operator families: one module each, one row each in `REGISTRY` (the shim has the same
rows, and contract.json names them).

The live families load on first use of `REGISTRY` (or of a family class): the offline tools
import only the light layout modules beside them (`*_layout.py`, `layouts.py`), not pandas
or pyspark's function machinery.
"""
from __future__ import annotations

import importlib
from typing import Any

_CLASSES = {"Deduplicate": ".dedup", "Aggregate": ".aggregate",
            "SessionWindow": ".session_window", "FlatMapGroupsWithState": ".flatmap",
            "TransformWithState": ".transform_with_state", "FamilyBase": ".base",
            "StateFamily": ".base"}


def __getattr__(name: str) -> Any:
    if name == "REGISTRY":
        registry = {cls.name: cls for cls in (
            __getattr__(n) for n in ("Deduplicate", "Aggregate", "SessionWindow",
                                     "FlatMapGroupsWithState", "TransformWithState"))}
        globals()["REGISTRY"] = registry
        return registry
    if name in _CLASSES:
        value = getattr(importlib.import_module(_CLASSES[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["REGISTRY", *_CLASSES]
