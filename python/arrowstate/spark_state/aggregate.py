"""Aggregation's state as Spark's stores lay it out: the grouping key columns as Spark's key
row, the aggregation buffer, field for field, as Spark's value row."""
from __future__ import annotations

from .layout import KeyValueLayout


class AggregateLayout(KeyValueLayout):
    family = "aggregate"
    holds = ("one row per group: the grouping keys, and as value the group's aggregation "
             "buffers (Spark's merge aggregate's)")


LAYOUT = AggregateLayout()
