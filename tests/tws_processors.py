"""transformWithState processors for tests (pickled by value, so workers need not import
this module)."""
import pandas as pd
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

    def close(self):
        pass
