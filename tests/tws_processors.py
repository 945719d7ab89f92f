"""transformWithState processors for tests (pickled by value, so workers need not import
this module)."""
import pandas as pd
from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import StatefulProcessor
from pyspark.sql.types import LongType, StructField, StructType


class RunningCount(StatefulProcessor):
    """transformWithStateInPandas: a running count per key in a ValueState."""

    def init(self, handle):
        self.count = handle.getValueState("count", StructType([StructField("n", LongType())]))

    def handleInputRows(self, key, rows, timerValues):
        n = self.count.get()[0] if self.count.exists() else 0
        for pdf in rows:
            n += len(pdf)
        self.count.update((n,))
        yield pd.DataFrame({"user": [key[0]], "count": [n]})


class EveryVariable(StatefulProcessor):
    """A value, a list and a map per key; at four rows all three are cleared or trimmed.
    Reports what the state holds, so a value that comes back wrong shows."""

    def init(self, handle):
        self.count = handle.getValueState("count", "n long")
        self.items = handle.getListState("items", "v long, at timestamp")
        self.seen = handle.getMapState("seen", "k string", "c long, last double")

    def _update(self, user, values, stamps):
        n = self.count.get()[0] if self.count.exists() else 0
        n += len(values)
        for v, at in zip(values, stamps):
            self.items.appendValue((v, at))
            c = self.seen.getValue((str(v),))
            self.seen.updateValue((str(v),), ((c[0] if c else 0) + 1, v / 2))
        if n >= 4:
            self.count.clear()
            self.items.clear()
            self.seen.removeKey(("1",))
        else:
            self.count.update((n,))
            if n == 3:
                self.items.put([(n, None)])
        listed = sorted(self.items.get(), key=repr)
        entries = sorted(self.seen.iterator(), key=repr)
        return (user, n, repr(listed), repr(entries), self.items.exists(), self.seen.exists(),
                self.seen.containsKey(("2",)))

    def handleInputRows(self, key, rows, timerValues):
        values, stamps = [], []
        for pdf in rows:
            values += pdf["v"].tolist()
            stamps += list(pdf["ts"])
        user, n, listed, entries, has_items, has_seen, has_two = self._update(
            key[0], values, stamps)
        yield pd.DataFrame({"user": [user], "count": [n], "items": [listed],
                            "entries": [entries], "has_items": [has_items],
                            "has_seen": [has_seen], "has_two": [has_two]})


class EveryVariableRows(EveryVariable):
    """EveryVariable through the Row API."""

    def handleInputRows(self, key, rows, timerValues):
        values, stamps = [], []
        for row in rows:
            values.append(row.v)
            stamps.append(row.ts)
        user, n, listed, entries, has_items, has_seen, has_two = self._update(
            key[0], values, stamps)
        yield Row(user=user, count=n, items=listed, entries=entries, has_items=has_items,
                  has_seen=has_seen, has_two=has_two)


EVERY_VARIABLE_OUTPUT = ("user string, count long, items string, entries string, "
                         "has_items boolean, has_seen boolean, has_two boolean")
