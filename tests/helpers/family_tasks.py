"""Drives an operator family as the worker does, without Spark: the tests of families
(tests/unit) make their tasks and commits here."""
import base64
import datetime as dt

import pandas as pd
import pyarrow as pa
from pyspark.serializers import CloudPickleSerializer
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from arrowstate.families import SessionWindow, TransformWithState
from arrowstate.store.versions.versioned import VersionedState


def task(family_class, operator, schema):
    """A family and an empty state, as the worker makes them for a task."""
    family = family_class(operator, schema)
    return family, VersionedState(family.key_fields, family.value_fields,
                                  named_columns=family.named_columns)


def commit(state, version):
    state.commit_files(version, 100)
    state.mark_committed(version, 1000)


TS = pa.timestamp("us", tz="UTC")
SESSION = pa.struct([("start", TS), ("end", TS)])
SESSION_SCHEMA = pa.schema([("c0", pa.string()), ("c1", SESSION), ("c2", pa.int64())])


def seconds(*values):
    """Zoned timestamps of these seconds (None: null)."""
    return pa.array([None if v is None else dt.datetime.fromtimestamp(v, dt.timezone.utc)
                     for v in values], TS)


def session_task(mode, **operator):
    """A session window family (rows of SESSION_SCHEMA: user, session, count) and a state."""
    return task(SessionWindow, {"keyIndexes": [0], "sessionIndex": 1, "eventTimeIndex": 1,
                                "outputMode": mode, "batchSize": 100, **operator},
                SESSION_SCHEMA)


class Keeps(StatefulProcessor):
    """Keeps a count, the values and a count per value."""

    def init(self, handle):
        from pyspark.sql.types import LongType, StringType, StructField, StructType
        long_ = StructType([StructField("n", LongType())])
        self.count = handle.getValueState("count", long_)
        self.values = handle.getListState("values", long_)
        self.per_value = handle.getMapState(
            "per_value", StructType([StructField("v", StringType())]), long_)

    def handleInputRows(self, key, rows, timerValues):
        n = self.count.get()[0] if self.count.exists() else 0
        for pdf in rows:
            for v in pdf["v"].tolist():
                n += 1
                self.values.appendValue((v,))
                seen = self.per_value.getValue((str(v),))
                self.per_value.updateValue((str(v),), ((seen[0] if seen else 0) + 1,))
        self.count.update((n,))
        if n >= 4:
            self.values.clear()
        yield pd.DataFrame({"user": [key[0]], "count": [n],
                            "values": [str(sorted(self.values.get()))],
                            "per_value": [str(sorted(self.per_value.iterator()))]})


def tws_task(processor=None, time_mode="None", **times):
    """A transformWithStateInPandas task of `processor` (Keeps by default) and an empty
    state; the schema of the rows it takes."""
    from pyspark.sql.streaming.stateful_processor_util import TransformWithStateInPandasUdfUtils
    schema = pa.schema([("user", pa.string()), ("user_", pa.string()), ("v", pa.int64())])
    udf = TransformWithStateInPandasUdfUtils(processor or Keeps(),
                                             time_mode).transformWithStateUDF
    command = base64.b64encode(CloudPickleSerializer().dumps((udf, None))).decode()
    operator = {
        "command": command, "pythonIncludes": [], "keyIndices": [0], "valueIndices": [1, 2],
        "pandas": True, "maxRecordsPerBatch": 10000, "variables": {},
        "runnerConf": {"spark.sql.session.timeZone": "UTC"}, "timeMode": time_mode, **times,
        "outputSchema": '{"type":"struct","fields":[{"name":"user","type":"string",'
                        '"nullable":true,"metadata":{}},{"name":"count","type":"long",'
                        '"nullable":true,"metadata":{}},{"name":"values","type":"string",'
                        '"nullable":true,"metadata":{}},{"name":"per_value","type":"string",'
                        '"nullable":true,"metadata":{}}]}'}
    return task(TransformWithState, operator, schema), schema
