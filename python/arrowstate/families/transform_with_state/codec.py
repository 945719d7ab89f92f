"""State values <-> Arrow, as Spark stores them: a value handed to update/append/updateValue
is stored as Spark stores it (numpy values made Python, then the state schema's
conversion), so get() returns what it would return natively, in the same batch too.
"""
from __future__ import annotations

import itertools

import pyarrow as pa

from ...spark_state.layout import arrow_fields
from ..group_state_values import StateValueWriter, python_values


def struct_schema(schema, parsed: str | None):
    """The variable's schema: as the JVM parsed it on the driver (`parsed`, JSON), since a
    DDL string is parsed by Spark's parser only."""
    import json

    from pyspark.sql.types import StructType
    if parsed is not None:
        return StructType.fromJson(json.loads(parsed))
    if not isinstance(schema, StructType):
        raise TypeError(f"arrowstate: a state schema must be a StructType or a DDL string, "
                        f"not {type(schema).__name__}")
    return schema


class Codec:
    """Python value tuples of one schema <-> Arrow, as Spark stores and returns them."""

    def __init__(self, schema, timezone: str) -> None:
        from pyspark.sql.streaming import stateful_processor_api_client as client
        client._load_numpy()   # pyspark's normaliser knows numpy only once this ran
        _normalize_state_value = client._normalize_state_value
        self.schema = schema
        self.fields = arrow_fields(schema, timezone)
        self.type = pa.struct(self.fields)
        self.writer = StateValueWriter(schema, self.fields)
        self._normalize = _normalize_state_value
        # what Spark makes of a value handed to the state: exactly-typed plain values are
        # that already; others have numpy values made Python (as pyspark's client does),
        # then the schema's conversion
        self._converted = self.writer.exact_or(lambda v: self.from_arrow(self.to_arrow([v]))[0])
        self.stored = self.writer.exact_or(self._normalized)

    def _normalized(self, value) -> tuple:
        if value is None:
            raise state_error("a state value cannot be null")
        return self._converted(tuple(map(self._normalize, value)))

    def to_arrow(self, values: list) -> pa.StructArray:
        return pa.StructArray.from_arrays(self.writer.columns(values), fields=self.fields)

    def stored_to_arrow(self, values: list) -> pa.StructArray:
        """to_arrow of values `stored` made (or from_arrow gave back)."""
        return pa.StructArray.from_arrays(self.writer.stored_columns(values),
                                          fields=self.fields)

    def from_arrow(self, array: pa.StructArray) -> list[tuple]:
        return python_values(array.flatten(), self.schema)


def list_offsets(lists: list) -> list[int]:
    return [0, *itertools.accumulate(map(len, lists))]


def state_error(what: str) -> Exception:
    from pyspark.errors import PySparkRuntimeError
    return PySparkRuntimeError(f"arrowstate: {what}")


class TtlCodec:
    """A TTL variable's stored element: (value, expiry ms) <-> struct<value, expiresAtMs>."""

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self.fields = [pa.field("value", codec.type), pa.field("expiresAtMs", pa.int64())]
        self.type = pa.struct(self.fields)

    def stored_to_arrow(self, elements: list) -> pa.StructArray:
        return pa.StructArray.from_arrays(
            [self.codec.stored_to_arrow([v for v, _ in elements]),
             pa.array([e for _, e in elements], pa.int64())], fields=self.fields)

    def from_arrow(self, array: pa.StructArray) -> list[tuple]:
        values, expiries = array.flatten()
        return list(zip(self.codec.from_arrow(values), expiries.to_pylist()))
