"""Operator families: one module each, one row each in `REGISTRY` (the shim has the same
rows, and contract.json names them). Each presents its state in Spark's layout through
spark_state (`layout`), which imports no family: the offline tools load none of them.
"""
from __future__ import annotations

from .aggregate import Aggregate
from .base import FamilyBase, StateFamily
from .dedup import Deduplicate
from .flatmap import FlatMapGroupsWithState
from .session_window import SessionWindow
from .transform_with_state import TransformWithState

REGISTRY = {cls.name: cls for cls in (Deduplicate, Aggregate, SessionWindow,
                                      FlatMapGroupsWithState, TransformWithState)}

__all__ = ["REGISTRY", "Deduplicate", "Aggregate", "SessionWindow", "FlatMapGroupsWithState",
           "TransformWithState", "FamilyBase", "StateFamily"]
