"""Work a state worker does in threads beside its tasks (snapshots, the tier's large merges)
is paced, so that it takes about BUSY_SHARE of a core and a task running meanwhile keeps the
rest (and the GIL): a snapshot or a merge of the largest runs, tens of seconds of work at tens
of millions of keys, then spreads over several micro-batches instead of stalling one."""
from __future__ import annotations

import time
from typing import Iterable, Iterator, TypeVar

BUSY_SHARE = 0.5

T = TypeVar("T")


def paced(items: Iterable[T]) -> Iterator[T]:
    """Yields the items, sleeping after each in proportion to the time the producer and the
    consumer spent on it."""
    idle = (1 - BUSY_SHARE) / BUSY_SHARE
    last = time.perf_counter()
    for item in items:
        yield item
        time.sleep((time.perf_counter() - last) * idle)
        last = time.perf_counter()
