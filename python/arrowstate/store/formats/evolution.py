"""State written in an older schema, read in the query's schema, as Spark reads it.

Spark decides, when it plans a run, whether a state variable's schema may change (its
StateSchemaCompatibilityChecker, which arrowstate's operators run as Spark's do); this
module only reads what it allowed:
- fields by name (`by_name`, Spark's Avro state encoding,
  `spark.sql.streaming.stateStore.encodingFormat=avro`): a field the query adds reads as
  null, one it removed is gone, fields may move, and a number widens as Avro's schema
  resolution widens it (int to long, float or double; long to float or double; float to
  double; Spark's byte and short are Avro ints); string and binary read as each other;
- fields by position (the default UnsafeRow encoding): names may change, types may not.
Nested structs, lists and maps follow the same rules. Anything else is not a change Spark
allows, and `evolved` raises ValueError.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

# what Avro widens each of Spark's numbers to (Avro's int covers byte, short and int)
_INTS = (pa.int8(), pa.int16(), pa.int32())
_WIDENS_TO = {**{t: (*_INTS, pa.int64(), pa.float32(), pa.float64()) for t in _INTS},
              pa.int64(): (pa.int64(), pa.float32(), pa.float64()),
              pa.float32(): (pa.float32(), pa.float64())}
_TEXT = (pa.string(), pa.binary(), pa.large_string(), pa.large_binary())


def evolved(array: pa.Array, to: pa.DataType, by_name: bool) -> pa.Array:
    """`array` (a stored column or part of one) as type `to`; ValueError when Spark does
    not allow that change."""
    have = array.type
    if have == to:
        return array
    if pa.types.is_struct(to) and pa.types.is_struct(have):
        return _struct(array, to, by_name)
    if pa.types.is_map(to) and pa.types.is_map(have):
        offsets, start, end = _offsets(array)
        keys = evolved(array.keys.slice(start, end - start), to.key_type, by_name)
        items = evolved(array.items.slice(start, end - start), to.item_type, by_name)
        return pa.MapArray.from_arrays(offsets, keys, items, type=to, mask=array.is_null())
    if pa.types.is_list(to) and pa.types.is_list(have):
        offsets, start, end = _offsets(array)
        values = evolved(array.values.slice(start, end - start), to.value_type, by_name)
        return pa.ListArray.from_arrays(offsets, values, type=to, mask=array.is_null())
    if by_name and (to in _WIDENS_TO.get(have, ()) or (have in _TEXT and to in _TEXT)):
        return pc.cast(array, to, safe=False)   # Avro's int covers Spark's byte and short
    raise ValueError(f"{have} cannot be read as {to}")


def _struct(array: pa.StructArray, to: pa.StructType, by_name: bool) -> pa.StructArray:
    have = array.type
    if not by_name and have.num_fields != to.num_fields:
        raise ValueError(f"{have} cannot be read as {to} (fields by position)")
    children = array.flatten()   # the parent's offset and nulls applied
    out = []
    for i, field in enumerate(to):
        at = have.get_field_index(field.name) if by_name else i
        out.append(pa.nulls(len(array), field.type) if at < 0
                   else evolved(children[at], field.type, by_name))
    return pa.StructArray.from_arrays(out, fields=list(to), mask=array.is_null())


def _offsets(array: pa.ListArray | pa.MapArray) -> tuple[pa.Array, int, int]:
    """A list's offsets from 0, and where its values start and end in the child array."""
    offsets = array.offsets
    start, end = offsets[0].as_py(), offsets[-1].as_py()
    return pc.subtract(offsets, pa.scalar(start, offsets.type)), start, end


def map_entries_evolved(array: pa.ListArray, to: pa.DataType, by_name: bool) -> pa.Array:
    """A map state variable's column (per grouping key, a list of key and value structs) in
    type `to`: its values as `evolved` reads them, its user keys by position, as Spark
    checks key schemas (names may change, types may not)."""
    have, want = array.type.value_type, to.value_type
    if not (pa.types.is_list(array.type) and pa.types.is_list(to)
            and [f.name for f in have] == [f.name for f in want] == ["key", "value"]):
        raise ValueError(f"{array.type} cannot be read as {to}")
    offsets, start, end = _offsets(array)
    entries = array.values.slice(start, end - start).flatten()
    keys = evolved(entries[0], want.field("key").type, by_name=False)
    values = evolved(entries[1], want.field("value").type, by_name)
    return pa.ListArray.from_arrays(
        offsets, pa.StructArray.from_arrays([keys, values], fields=list(want)), type=to,
        mask=array.is_null())


def variable_evolved(array: pa.Array, to: pa.DataType, by_name: bool,
                     is_map: bool | None = None) -> pa.Array:
    """A transformWithState variable's stored column in type `to`: a map's with
    `map_entries_evolved`, any other's with `evolved`. `is_map` None (a reader of the
    files that does not know the variables' kinds) takes a column of lists of structs of
    exactly a `key` struct and a `value` struct for a map's."""
    if is_map is None:
        entry = to.value_type if pa.types.is_list(to) else None
        is_map = (entry is not None and pa.types.is_struct(entry)
                  and [f.name for f in entry] == ["key", "value"]
                  and all(pa.types.is_struct(f.type) for f in entry))
    if is_map:
        return map_entries_evolved(array, to, by_name)
    return evolved(array, to, by_name)


def positional(_column_name: bytes, array: pa.Array, to: pa.DataType) -> pa.Array:
    """A stored column in type `to`, fields by position: how state of Spark's default
    encoding reads, and the `evolve` of files.decode for families that name no rule."""
    return evolved(array, to, by_name=False)
