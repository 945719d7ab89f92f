"""What transformWithState's state operations run in: the grouping key the processor is
being called for, the task's metrics and the count of state rows. The variables, their
clients and the timers get this, never the family: the family sets the key around each
call of the processor and reads the counts at the batch's end.
"""
from __future__ import annotations

from .codec import state_error

NO_KEY = object()   # no grouping key is being processed (a key may be None)


class OperationContext:
    """`group`: the grouping key being processed (NO_KEY between keys), as the state
    holds it; `metrics`: the task's metrics (the family's dict); `total`: the state rows
    Spark counts (numTotalStateRows), kept as state operations add and remove them."""

    __slots__ = ("group", "metrics", "total")

    def __init__(self, metrics: dict[str, int]) -> None:
        self.group = NO_KEY
        self.metrics = metrics
        self.total = 0

    def key(self):
        """The grouping key being processed; fails between keys, as Spark's handle does."""
        group = self.group
        if group is NO_KEY:
            raise state_error("state is only available while a grouping key is processed "
                              "(handleInputRows)")
        return group
