"""The GroupState value conversion: what native Spark's round trip (toInternal, pickling,
makeFromJava) makes of values a function hands state.update."""
import decimal

import pyarrow as pa
import pytest
from pyspark.sql.types import (ArrayType, ByteType, DecimalType, DoubleType, IntegerType,
                               StringType, StructField, StructType)

from arrowstate.families.group_state_values import (StateValueError, StateValueWriter,
                                                    _java_double_string)


@pytest.mark.parametrize("value, text", [
    (1e20, "1.0E20"), (1.5e-5, "1.5E-5"), (12345678.9, "1.23456789E7"), (0.001, "0.001"),
    (1e7, "1.0E7"), (100.0, "100.0"), (-2.5e-4, "-2.5E-4"), (-0.0, "-0.0"),
    (float("nan"), "NaN"), (float("-inf"), "-Infinity"), (9999999.0, "9999999.0")])
def test_doubles_become_strings_as_in_java(value, text):
    assert _java_double_string(value) == text


def _columns(types, *values):
    schema = StructType([StructField(f"f{i}", t) for i, t in enumerate(types)])
    from pyspark.sql.pandas.types import to_arrow_type
    fields = [pa.field(f.name, to_arrow_type(f.dataType, timezone="UTC")) for f in schema]
    return [c.to_pylist() for c in StateValueWriter(schema, fields).columns(list(values))]


def test_values_of_unexpected_types_become_null_and_integers_wrap():
    assert _columns([DoubleType(), IntegerType(), ByteType(), StringType()],
                    (1, 2.5, 300, True), (1.5, 2**40 + 7, -129, 2.0), None) == [
        [None, 1.5, None], [None, 7, None], [44, 127, None], ["true", "2.0", None]]


def test_decimals_round_half_up_and_too_many_digits_fail():
    assert _columns([DecimalType(5, 2)], (decimal.Decimal("1.005"),), (1.0,)) == [
        [decimal.Decimal("1.01"), None]]
    with pytest.raises(StateValueError, match="DECIMAL_PRECISION_EXCEEDS_MAX_PRECISION"):
        _columns([DecimalType(5, 2)], (decimal.Decimal("1234.5"),))


def test_values_native_spark_cannot_pickle_fail_clearly():
    import numpy as np
    with pytest.raises(StateValueError, match="numpy.ndarray cannot be pickled"):
        _columns([ArrayType(IntegerType())], (np.array([1, 2]),))
    with pytest.raises(StateValueError, match="STRUCT_ARRAY_LENGTH_MISMATCH"):
        _columns([IntegerType(), IntegerType()], (1,))


def test_values_of_exactly_the_fields_types_take_the_vectorised_path_with_the_same_result():
    from pyspark.sql.types import BooleanType, LongType
    types = [LongType(), IntegerType(), ByteType(), DoubleType(), StringType(), BooleanType()]
    schema = StructType([StructField(f"f{i}", t) for i, t in enumerate(types)])
    from pyspark.sql.pandas.types import to_arrow_type
    fields = [pa.field(f.name, to_arrow_type(f.dataType, timezone="UTC")) for f in schema]
    exact = StateValueWriter(schema, fields)
    general = StateValueWriter(schema, fields)
    general.exact_kinds = None
    cases = [
        [(2**62, -2**31, 127, 1.5, "é", True), (0, 7, -128, float("nan"), "", False)],
        [(1, 2**31, 1, 1.0, "x", True)],       # out of an int's range: wraps, as Java does
        [(1, 2, 300, 1.0, "x", True)],          # out of a byte's range
        [(1, 2, 3, 1, "x", True)],              # an int for a double: null
        [(1, 2, 3, 1.0, "x", 1)],               # an int for a boolean
        [[1, 2, 3, 1.0, "x", True]],            # a list, not a tuple
    ]
    assert exact._exact_columns(cases[0]) is not None
    for values in cases[1:]:
        assert exact._exact_columns(values) is None, values
    for values in cases:
        got = [c.to_pylist() for c in exact.columns(values)]
        want = [c.to_pylist() for c in general.columns(values)]
        assert repr(got) == repr(want), values


def test_an_exact_value_keeps_integers_within_each_fields_width():
    from pyspark.sql.types import LongType, ShortType
    types = [ByteType(), ShortType(), IntegerType(), LongType()]
    schema = StructType([StructField(f"f{i}", t) for i, t in enumerate(types)])
    fields = [pa.field(f.name, t) for f, t in
              zip(schema, [pa.int8(), pa.int16(), pa.int32(), pa.int64()])]
    writer = StateValueWriter(schema, fields)
    exact = writer.exact_or(lambda value: "converted")
    assert exact((127, -32768, 2**31 - 1, 2**63 - 1)) == (127, -32768, 2**31 - 1, 2**63 - 1)
    for value in [(300, 0, 0, 0), (0, 2**15, 0, 0), (0, 0, 2**31, 0), (0, 0, 0, 2**63),
                  (1.0, 0, 0, 0), (True, 0, 0, 0), (0, 0, 0), [0, 0, 0, 0]]:
        assert exact(value) == "converted", value
    # one field: a check of its own
    for t, arrow, ok, not_ok in [
            (LongType(), pa.int64(), [(2**63 - 1,), (-2**63,)], [(2**63,), (True,), (1.5,)]),
            (ByteType(), pa.int8(), [(-128,)], [(128,)]),
            (StringType(), pa.string(), [("a",)], [(b"a",), (None,)])]:
        one = StateValueWriter(StructType([StructField("f", t)]), [pa.field("f", arrow)])
        exact = one.exact_or(lambda value: "converted")
        assert [exact(v) for v in ok] == ok
        assert [exact(v) for v in not_ok + [[1], (1, 2), None]] == ["converted"] * (
            len(not_ok) + 3)


def test_stored_values_go_to_arrow_as_the_checked_path_takes_them():
    from pyspark.sql.types import LongType
    schema = StructType([StructField("n", LongType()), StructField("s", StringType())])
    writer = StateValueWriter(schema, [pa.field("n", pa.int64()), pa.field("s", pa.string())])
    values = [(1, "a"), (None, "b"), (2**63 - 1, None)]
    assert [c.to_pylist() for c in writer.stored_columns(values)] == \
        [c.to_pylist() for c in writer.columns(values)]
