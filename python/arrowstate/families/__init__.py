"""Operator families: one module each, one row each in `REGISTRY` (the shim has the same
rows, and contract.json names them)."""
from __future__ import annotations

from .aggregate import Aggregate
from .base import FamilyBase, StateFamily
from .dedup import Deduplicate
from .flatmap import FlatMapGroupsWithState
from .session_window import SessionWindow
from .transform_with_state import TransformWithState

REGISTRY: dict[str, type[StateFamily]] = {
    family.name: family for family in (Deduplicate, Aggregate, SessionWindow,
                                       FlatMapGroupsWithState, TransformWithState)}

__all__ = ["REGISTRY", "StateFamily", "FamilyBase", "Aggregate", "Deduplicate",
           "FlatMapGroupsWithState", "SessionWindow", "TransformWithState"]
