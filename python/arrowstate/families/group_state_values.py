"""How native Spark stores the value a function hands GroupState.update.

Natively the value makes a round trip: pyspark's worker turns it into internal form with
the state schema's toInternal, pickles it, and the JVM unpickles it (Pyrolite) and converts
it with EvaluatePython.makeFromJava, which silently makes null of a value of an unexpected
Java type (an int for a double field), wraps integers to the field's width, rounds
decimals half-up to the field's scale and calls toString for strings. A value that cannot
make the trip (a numpy array, a nested numpy scalar) fails the task.

This module does the same conversion in Python, so that state written by arrowstate holds
what native state would hold, and the function reads back what it would read natively.
"""
from __future__ import annotations

import decimal
import math
from typing import Any, Callable

import pyarrow as pa

from ..errors import ArrowStateError

Converter = Callable[[Any], Any]
_INT_BITS = {"byte": 8, "short": 16, "integer": 32, "long": 64}


def python_values(columns: list[pa.Array], schema) -> list[tuple]:
    """Stored state columns (one per field of `schema`) as the value tuples pyspark hands
    Python code for the schema's types (a timestamp as a naive local datetime, as natively,
    not Arrow's), converted once for all the rows: GroupState's and transformWithState's."""
    from pyspark.sql.conversion import ArrowTableToRowsConversion

    if not columns or len(columns[0]) == 0:
        return []
    table = pa.Table.from_batches([pa.RecordBatch.from_arrays(columns, names=schema.names)])
    return [tuple(v) for v in
            ArrowTableToRowsConversion.convert(table, schema, return_as_tuples=True)]


class StateValueError(ArrowStateError, ValueError):
    """A value native Spark could not store either."""

    def __init__(self, reason: str,
                 condition: str = "ARROWSTATE_STATE_VALUE_NOT_STORABLE") -> None:
        super().__init__(condition, reason, reason=reason)


def _java_kind(v: Any) -> str:
    """The Java type Pyrolite makes of a pickled Python value."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "Boolean"
    if isinstance(v, int):
        if -2**31 <= v < 2**31:
            return "Integer"
        return "Long" if -2**63 <= v < 2**63 else "BigInteger"
    if isinstance(v, float):
        return "Double"
    if isinstance(v, str):
        return "String"
    if isinstance(v, (bytes, bytearray)):
        return "byte[]"
    if isinstance(v, decimal.Decimal):
        if not v.is_finite():
            raise StateValueError(f"{v!r} has no Java BigDecimal form")
        return "BigDecimal"
    if isinstance(v, list):
        return "ArrayList"
    if isinstance(v, tuple):
        return "Object[]"
    if isinstance(v, dict):
        return "HashMap"
    if isinstance(v, (set, frozenset)):
        return "HashSet"
    raise StateValueError(
        f"a {type(v).__module__}.{type(v).__name__} cannot be pickled to the JVM (native "
        "Spark fails on it too); convert it to a Python value first")


def _wrap(v: int, bits: int) -> int:
    """Java's narrowing of an integer to `bits`."""
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >= 1 << (bits - 1) else v


def _java_double_string(x: float) -> str:
    """Java's Double.toString."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0:
        return "-0.0" if math.copysign(1, x) < 0 else "0.0"
    if 1e-3 <= abs(x) < 1e7:
        text = repr(x)
        return text if "." in text else text + ".0"
    sign, digits, exponent = decimal.Decimal(repr(x)).normalize().as_tuple()
    digits = "".join(map(str, digits))
    power = exponent + len(digits) - 1
    return f"{'-' if sign else ''}{digits[0]}.{digits[1:] or '0'}E{power}"


def _java_string(v: Any) -> str:
    """UTF8String.fromString(obj.toString) for the values whose toString is known."""
    kind = _java_kind(v)
    if kind == "String":
        return v
    if kind == "Boolean":
        return "true" if v else "false"
    if kind in ("Integer", "Long", "BigInteger", "BigDecimal"):
        return str(v)   # Python's Decimal str follows the same standard as BigDecimal's
    if kind == "Double":
        return _java_double_string(v)
    raise StateValueError(f"native Spark would store the Java toString of a {kind} "
                          f"({type(v).__name__}) in a string field; pass a str")


def from_java(data_type) -> Converter:
    """EvaluatePython.makeFromJava for `data_type`, on the internal Python value; the result
    is what pa.array takes for the field's Arrow storage type (see storage_type)."""
    name = data_type.typeName()

    def null_safe(accept: Callable[[Any, str], Any]) -> Converter:
        def convert(v):
            kind = _java_kind(v)
            return None if kind == "null" else accept(v, kind)
        return convert

    if name == "boolean":
        return null_safe(lambda v, k: v if k == "Boolean" else None)
    if name in _INT_BITS:
        bits = _INT_BITS[name]
        return null_safe(lambda v, k: _wrap(v, bits) if k in ("Integer", "Long") else None)
    if name in ("float", "double"):
        return null_safe(lambda v, k: v if k == "Double" else None)
    if name == "decimal":
        precision, scale = data_type.precision, data_type.scale
        quantum = decimal.Decimal(1).scaleb(-scale)
        context = decimal.Context(prec=100)

        def to_decimal(v, k):
            if k != "BigDecimal":
                return None
            d = v.quantize(quantum, rounding=decimal.ROUND_HALF_UP, context=context)
            digits = len(d.as_tuple().digits)
            if max(digits, scale) > precision:
                raise StateValueError(
                    f"Decimal precision {max(digits, scale)} exceeds max precision "
                    f"{precision}: {v}", "DECIMAL_PRECISION_EXCEEDS_MAX_PRECISION")
            return d
        return null_safe(to_decimal)
    if name == "date":
        return null_safe(lambda v, k: v if k == "Integer" else None)
    if name in ("timestamp", "timestamp_ntz") or name.startswith("interval day"):
        return null_safe(lambda v, k: v if k in ("Integer", "Long") else None)
    if name == "string":
        return null_safe(lambda v, k: _java_string(v))
    if name == "binary":
        return null_safe(lambda v, k: v.encode("utf-8") if k == "String"
                         else bytes(v) if k == "byte[]" else None)
    if name == "array":
        element = from_java(data_type.elementType)
        return null_safe(lambda v, k: [element(e) for e in v]
                         if k in ("ArrayList", "Object[]") else None)
    if name == "map":
        key, value = from_java(data_type.keyType), from_java(data_type.valueType)
        return null_safe(lambda v, k: [(key(a), value(b)) for a, b in v.items()]
                         if k == "HashMap" else None)
    if name == "struct":
        return struct_from_java(data_type)
    raise StateValueError(f"no conversion for state type {data_type.simpleString()}")


def struct_from_java(schema) -> Converter:
    from pyspark.sql.pandas.types import _dedup_names

    fields = [from_java(f.dataType) for f in schema.fields]
    # as the Arrow struct names them (spark_state.layout.arrow_fields)
    names = _dedup_names(schema.names)

    def convert(v):
        kind = _java_kind(v)
        if kind != "Object[]":
            return None
        if len(v) != len(fields):
            raise StateValueError(
                f"the state value has {len(v)} values, the schema "
                f"{schema.simpleString()} {len(fields)}", "STRUCT_ARRAY_LENGTH_MISMATCH")
        return {n: f(x) for n, f, x in zip(names, fields, v)}
    return convert


def storage_type(t: pa.DataType) -> pa.DataType:
    """The Arrow type whose Python values are Spark's internal ones (timestamps and
    durations as int64 microseconds, dates as int32 days); cast to `t` afterwards."""
    if pa.types.is_timestamp(t) or pa.types.is_duration(t):
        return pa.int64()
    if pa.types.is_date32(t):
        return pa.int32()
    if pa.types.is_map(t):
        return pa.map_(storage_type(t.key_type), storage_type(t.item_type))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(storage_type(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(storage_type(f.type)) for f in t])
    return t


def _exact_or(kinds: list[type] | None, ranges: list[tuple[int, int, int]], otherwise):
    """A function of a value that returns it as it is when it makes the round trip
    unchanged (a tuple of exactly the fields' Python types, integers within their field's
    width), else otherwise(value). It runs on every state operation, so a one-field schema
    gets a check of its own, one call in all."""
    if kinds is None:
        return otherwise
    if len(kinds) == 1:
        kind = kinds[0]
        low, high = ranges[0][1:] if ranges else (None, None)

        def exact_or_one(value):
            if type(value) is tuple and len(value) == 1 and type(value[0]) is kind and (
                    low is None or low <= value[0] < high):
                return value
            return otherwise(value)
        return exact_or_one
    width = len(kinds)

    def exact_or(value):
        if type(value) is not tuple or len(value) != width:
            return otherwise(value)
        for v, k in zip(value, kinds):
            if type(v) is not k:
                return otherwise(value)
        for i, low, high in ranges:
            if not low <= value[i] < high:
                return otherwise(value)
        return value
    return exact_or


class StateValueWriter:
    """Turns the values functions handed GroupState.update into the state's Arrow columns,
    as native Spark would store them."""

    def __init__(self, schema, fields: list[pa.Field]):
        from pyspark.sql.types import (BooleanType, ByteType, DoubleType, IntegerType,
                                       LongType, ShortType, StringType)
        self.schema = schema
        self.needs_internal = any(f.needConversion() for f in schema.fields)
        self.row = struct_from_java(schema)
        self.types = [f.type for f in fields]
        self.storage = [storage_type(t) for t in self.types]
        # Fields whose values of exactly this Python type make the round trip unchanged
        # (an int in range of an integral field, a float for a double, a str, a bool).
        exact = {LongType: int, IntegerType: int, ShortType: int, ByteType: int,
                 DoubleType: float, StringType: str, BooleanType: bool}
        kinds = [exact.get(type(f.dataType)) for f in schema.fields]
        self.exact_kinds = kinds if all(kinds) else None
        bits = [_INT_BITS.get(f.dataType.typeName()) for f in schema.fields]
        self._ranges = [(i, -2 ** (b - 1), 2 ** (b - 1)) for i, b in enumerate(bits) if b]

    def exact_or(self, otherwise):
        """A function that returns a value tuple as it is when it makes the round trip
        unchanged, else otherwise(value)."""
        return _exact_or(self.exact_kinds, self._ranges, otherwise)

    def _exact_columns(self, values: list) -> list[pa.Array] | None:
        """The columns in one vectorised step when every value is a tuple of exactly the
        fields' Python types (what running counts and the like store); None otherwise."""
        width = len(self.types)
        if not all(type(v) is tuple and len(v) == width for v in values):
            return None
        columns = []
        for i, (kind, t) in enumerate(zip(self.exact_kinds, self.types)):
            column = [v[i] for v in values]
            if not all(type(x) is kind for x in column):
                return None
            try:   # out of the field's range: the general path wraps it as Java does
                columns.append(pa.array(column, t))
            except (OverflowError, pa.ArrowInvalid):
                return None
        return columns

    def stored_columns(self, values: list) -> list[pa.Array]:
        """columns() of value tuples as transformWithState holds them (Codec.stored made
        them, or Arrow gave them back): where the schema has exact kinds each field is of
        its kind, in range, or None, so the values go to Arrow as they are, with no check."""
        if self.exact_kinds is None or not values:
            return self.columns(values)
        return [pa.array([v[i] for v in values], t) for i, t in enumerate(self.types)]

    def columns(self, values: list) -> list[pa.Array]:
        """`values`: per row the updated value tuple, or None where no value is defined."""
        if self.exact_kinds is not None and values:
            exact = self._exact_columns(values)
            if exact is not None:
                return exact
        rows = []
        for v in values:
            if v is None:
                rows.append(None)
                continue
            internal = self.schema.toInternal(v) if self.needs_internal else tuple(v)
            rows.append(self.row(internal))
        columns = []
        for name, t, storage in zip(self.schema.names, self.types, self.storage):
            array = pa.array([None if r is None else r[name] for r in rows], storage)
            columns.append(array if storage == t else array.cast(t))
        return columns
