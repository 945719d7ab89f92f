"""store.formats.evolution: stored state read in a newer schema, as Spark's encodings read it (the
Spark runs are in tests/spark/test_tws_schema_evolution.py)."""
import pyarrow as pa
import pytest

from arrowstate.store.formats import evolution

OLD = pa.struct([("id", pa.int32()), ("name", pa.string()), ("score", pa.float32())])


def values():
    # a null struct, a sliced array (offsets), nulls inside
    whole = pa.array([{"id": 9, "name": "x", "score": 0.5}, {"id": 1, "name": "a", "score": 1.5},
                      None, {"id": None, "name": "c", "score": None}], OLD)
    return whole.slice(1)


def test_fields_by_name_added_removed_moved_and_widened():
    to = pa.struct([("score", pa.float64()), ("count", pa.int32()), ("id", pa.int64())])
    got = evolution.evolved(values(), to, by_name=True)
    assert got.type == to
    assert got.to_pylist() == [{"score": 1.5, "count": None, "id": 1}, None,
                               {"score": None, "count": None, "id": None}]


def test_fields_by_position_take_new_names_and_keep_types():
    to = pa.struct([("a", pa.int32()), ("b", pa.string()), ("c", pa.float32())])
    assert evolution.evolved(values(), to, by_name=False).to_pylist() == [
        {"a": 1, "b": "a", "c": 1.5}, None, {"a": None, "b": "c", "c": None}]
    with pytest.raises(ValueError):   # UnsafeRow reads no added field, no widened type
        evolution.evolved(values(), pa.struct([("a", pa.int64()), ("b", pa.string()),
                                               ("c", pa.float32())]), by_name=False)
    with pytest.raises(ValueError):
        evolution.evolved(values(), pa.struct([("a", pa.int32())]), by_name=False)


@pytest.mark.parametrize("have,to", [(pa.int64(), pa.int32()), (pa.float64(), pa.float32()),
                                     (pa.int32(), pa.string()), (pa.string(), pa.int32()),
                                     (pa.float32(), pa.int64()), (pa.bool_(), pa.int32())])
def test_what_avro_does_not_widen_is_refused(have, to):
    with pytest.raises(ValueError):
        evolution.evolved(pa.array([1], pa.int8()).cast(have) if have != pa.string()
                          else pa.array(["1"]), to, by_name=True)


def test_spark_byte_and_short_are_avro_ints():
    got = evolution.evolved(pa.array([1, -2, None], pa.int16()), pa.int64(), by_name=True)
    assert got.to_pylist() == [1, -2, None] and got.type == pa.int64()


def test_lists_and_maps_nested_sliced_and_null():
    lists = pa.array([[{"id": 0, "name": "z", "score": 0.0}],
                      [{"id": 1, "name": "a", "score": 1.0}, None], None, []],
                     pa.list_(OLD)).slice(1)
    to = pa.list_(pa.struct([("id", pa.int64()), ("tag", pa.string())]))
    assert evolution.evolved(lists, to, by_name=True).to_pylist() == [
        [{"id": 1, "tag": None}, None], None, []]
    maps = pa.array([[("k", 1)], None, [("a", 2), ("b", 3)]],
                    pa.map_(pa.string(), pa.int32())).slice(1)
    got = evolution.evolved(maps, pa.map_(pa.string(), pa.int64()), by_name=True)
    assert got.to_pylist() == [None, [("a", 2), ("b", 3)]]


def test_a_map_variables_keys_by_position_and_values_by_name():
    key = pa.struct([("k", pa.string())])
    value = pa.struct([("v", pa.float32()), ("w", pa.int32())])
    entries = pa.struct([("key", key), ("value", value)])
    column = pa.array([[{"key": {"k": "x"}, "value": {"v": 1.5, "w": 2}}], None],
                      pa.list_(entries))
    to = pa.list_(pa.struct([("key", pa.struct([("name", pa.string())])),
                             ("value", pa.struct([("w", pa.int64())]))]))
    got = evolution.map_entries_evolved(column, to, by_name=True)
    assert got.to_pylist() == [[{"key": {"name": "x"}, "value": {"w": 2}}], None]
    with pytest.raises(ValueError):   # a key's type may not change
        evolution.map_entries_evolved(column, pa.list_(pa.struct([
            ("key", pa.struct([("k", pa.int32())])), ("value", value)])), by_name=True)
