"""Session windows' state as Spark's stores lay it out: the grouping key and the session
window as Spark's key row, the session's aggregation buffer, field for field, as Spark's
value row. Spark's store is scanned by the key without the session start: the shim reads
and writes it with the key encoding, and places its rows by the partitioning, that the
operator's metadata records (`numColsPrefixKey`)."""
from __future__ import annotations

from .layout import KeyValueLayout


class SessionWindowLayout(KeyValueLayout):
    family = "sessionWindow"
    holds = ("one row per open session: the grouping keys and the session's start as key, "
             "the whole aggregated row (keys, session window, buffers) as value")


LAYOUT = SessionWindowLayout()
