"""Aggregation's state as Spark's stores lay it out: the grouping key columns as Spark's key
row, the aggregation buffer, field for field, as Spark's value row."""
from __future__ import annotations

from .spark_layout import KeyValueLayout


class AggregateLayout(KeyValueLayout):
    family = "aggregate"


LAYOUT = AggregateLayout()
