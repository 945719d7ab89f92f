"""Arrow columns <-> hashable Python values, for keys and values held in state.

Two keys are equal here exactly when Spark's binary row encoding makes them equal: strings
by their bytes (valid UTF-8 or not), floats by their bits after Spark's normalisation (-0.0
is 0.0, every NaN is one NaN), structs by their fields, and a null struct differs from a
struct of nulls. Only the dict of live keys
holds these values: state rows themselves stay in Arrow.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_INT_VIEW = {pa.float64(): (pa.int64(), np.int64), pa.float32(): (pa.int32(), np.int32)}


def _numeric(arr: pa.Array, as_type: pa.DataType) -> list:
    if arr.type != as_type:
        arr = arr.view(as_type) if pa.types.is_temporal(arr.type) else arr.cast(as_type)
    if arr.null_count == 0:
        return arr.to_numpy(zero_copy_only=False).tolist()
    return arr.to_pylist()


def _float_bits(arr: pa.Array) -> list:
    int_type, np_int = _INT_VIEW[arr.type]
    values = arr.to_numpy(zero_copy_only=False)
    values = np.where(values == 0, values.dtype.type(0), values)   # -0.0 -> 0.0
    values = np.where(np.isnan(values), values.dtype.type(np.nan), values)
    bits = values.view(np_int).tolist()
    if arr.null_count:
        valid = arr.is_valid().to_numpy(zero_copy_only=False)
        bits = [b if ok else None for b, ok in zip(bits, valid)]
    return bits


def _tupled(v: Any) -> Any:
    return tuple(_tupled(x) for x in v) if isinstance(v, list) else v


def column_values(arr: pa.Array | pa.ChunkedArray) -> list:
    """One hashable Python value per row of an Arrow column."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if pa.types.is_null(t):
        return [None] * len(arr)
    if pa.types.is_boolean(t) or pa.types.is_integer(t):
        return _numeric(arr, t)
    if pa.types.is_date32(t):
        return _numeric(arr, pa.int32())
    if pa.types.is_timestamp(t):
        return _numeric(arr, pa.int64())
    if pa.types.is_floating(t):
        return _float_bits(arr)
    if pa.types.is_struct(t):
        children = [column_values(child) for child in arr.flatten()]
        rows = list(zip(*children)) if children else [()] * len(arr)
        if arr.null_count:
            valid = arr.is_valid().to_numpy(zero_copy_only=False)
            rows = [r if ok else None for r, ok in zip(rows, valid)]
        return rows
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [_tupled(v) for v in arr.to_pylist()]
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        # as bytes: Spark compares strings by their bytes, which need not be UTF-8
        # (cast(binary as string)); decoding would fail on those and cost time
        return arr.view(pa.binary() if pa.types.is_string(t) else pa.large_binary()).to_pylist()
    # binary, decimals: Python's own values hash and compare like Spark's bytes.
    return arr.to_pylist()


def _fixed_width(arr: pa.Array, parts: list, seeds: tuple[int, int] | None = None) -> bool:
    """Appends (rows x bytes) uint8 blocks that encode the column exactly, validity first;
    False if a type has no fixed-width encoding here. With `seeds` (keys of the state tier),
    decimals are encoded too (their 16 or 32 bytes: one column has one scale), and strings
    and binaries by a 128-bit hash of their bytes under those seeds (`_hashed`)."""
    t = arr.type
    parts.append(arr.is_valid().to_numpy(zero_copy_only=False).view(np.uint8)[:, None])
    if pa.types.is_struct(t):
        return all(_fixed_width(child, parts, seeds) for child in arr.flatten())
    if seeds is not None and (pa.types.is_decimal(t)):
        width = t.byte_width
        raw = (np.frombuffer(arr.buffers()[1], np.uint8)[arr.offset * width:
                                                         (arr.offset + len(arr)) * width]
               if len(arr) else np.zeros(0, np.uint8)).reshape(len(arr), width).copy()
        raw[~arr.is_valid().to_numpy(zero_copy_only=False)] = 0
        parts.append(raw)
        return True
    if seeds is not None and _is_bytes(t):
        parts.append(_hashed(arr, seeds))
        return True
    if pa.types.is_floating(t):
        values = pc.fill_null(arr, 0).to_numpy(zero_copy_only=False)
        values = np.where(values == 0, values.dtype.type(0), values)   # -0.0 -> 0.0
        values = np.where(np.isnan(values), values.dtype.type(np.nan), values)
    elif pa.types.is_timestamp(t) or pa.types.is_date(t):
        values = pc.fill_null(arr.view(pa.int64() if pa.types.is_timestamp(t) or
                                       pa.types.is_date64(t) else pa.int32()), 0)
        values = values.to_numpy(zero_copy_only=False)
    elif pa.types.is_integer(t) or pa.types.is_boolean(t):
        values = pc.fill_null(arr, 0 if pa.types.is_integer(t) else False)
        values = values.to_numpy(zero_copy_only=False)
    else:
        return False
    values = np.ascontiguousarray(values)
    parts.append(values.view(np.uint8).reshape(len(arr), values.dtype.itemsize))
    return True


def rows(columns: Sequence[pa.Array], num_rows: int) -> list:
    """One hashable key per row of several columns. The form depends only on the column
    types, so a state always uses one: the column's own value for a single column; for
    fixed-width columns, one bytes string per row (validity and normalised bits, built in
    numpy: hashing bytes is far cheaper than hashing tuples); for fixed-width columns
    among strings and binaries, one bytes string per row too (`_row_bytes`); otherwise
    row tuples."""
    if not columns:
        return [()] * num_rows
    if len(columns) == 1 or num_rows == 0:
        return column_values(columns[0])
    # per column, once: its fixed-width block, or the column itself if a string or binary
    encoded: list = []
    for column in columns:
        parts: list[np.ndarray] = []
        if _fixed_width(column, parts):
            encoded.append(np.concatenate(parts, axis=1))
        elif _is_bytes(column.type):
            encoded.append(column)
        else:
            return list(zip(*(column_values(c) for c in columns)))
    if all(isinstance(e, np.ndarray) for e in encoded):
        block = np.ascontiguousarray(np.concatenate(encoded, axis=1))
        return block.view(f"V{block.shape[1]}").ravel().tolist()
    return _row_bytes(encoded, num_rows)


def _row_bytes(encoded: list, num_rows: int) -> list:
    """One bytes string per row of fixed-width blocks and string or binary columns: a
    block's bytes as they are, a string's validity byte, its length in 8 bytes and its
    bytes. Every part's length is known from the type or from its length, so equal bytes
    mean equal rows, as in Spark's binary rows. Joined by Arrow a row at a time in C++: a
    bytes key hashes and compares faster than a tuple of bytes and ints, whose hash is not
    cached."""
    pieces: list[pa.Array] = []
    for part in encoded:
        if isinstance(part, np.ndarray):
            pieces.append(_binary(part))
            continue
        column = part.combine_chunks() if isinstance(part, pa.ChunkedArray) else part
        raw = column.view(pa.large_binary() if pa.types.is_large_string(column.type)
                          or pa.types.is_large_binary(column.type) else pa.binary())
        head = np.empty((num_rows, 9), np.uint8)
        head[:, 0] = column.is_valid().to_numpy(zero_copy_only=False)
        lengths = pc.fill_null(pc.binary_length(raw), 0).to_numpy(zero_copy_only=False)
        head[:, 1:] = lengths.astype("<i8").view(np.uint8).reshape(num_rows, 8)
        pieces += [_binary(head), pc.fill_null(raw, b"")]
    joined = pc.binary_join_element_wise(*[p.cast(pa.large_binary()) for p in pieces],
                                         pa.scalar(b"", pa.large_binary()))
    return joined.to_pylist()


def _binary(block: np.ndarray) -> pa.Array:
    """The rows of a (rows x width) uint8 block as a binary array."""
    block = np.ascontiguousarray(block)
    return pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(block.shape[1]), block.shape[0], [None, pa.py_buffer(block)])


def event_time_micros(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Event time in microseconds and its validity; a window struct counts by its end."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    valid = arr.is_valid().to_numpy(zero_copy_only=False)
    if pa.types.is_struct(arr.type):
        arr = arr.flatten()[1]
        valid = valid & arr.is_valid().to_numpy(zero_copy_only=False)
    micros = pc.fill_null(arr.view(pa.int64()), 0).to_numpy(zero_copy_only=False)
    return micros, valid


_TIME_OR_INTEGER = (pa.types.is_integer, pa.types.is_date, pa.types.is_timestamp)


def key_dtype(fields: Sequence[pa.Field]) -> np.dtype | None:
    """The fixed-width numpy form of keys of these fields, for stores that keep keys in
    arrays: int64 for one integer or time column that cannot be null, else the bytes of
    `rows`' fixed-width block (`S<width>`: validity and normalised bits, equal exactly when
    Spark's keys are; strings and binaries by a 128-bit hash, decimals by their bytes, as
    `key_array` makes them under a state's seeds); None when some column has no fixed width
    (lists, maps)."""
    if not fields:
        return None
    if (len(fields) == 1 and not fields[0].nullable
            and any(is_type(fields[0].type) for is_type in _TIME_OR_INTEGER)):
        return np.dtype(np.int64)
    return bytes_dtype(fields)


def bytes_dtype(fields: Sequence[pa.Field]) -> np.dtype | None:
    """`S<width>` of the fixed-width block of these fields (a key's first fields give its
    first bytes: a prefix), or None when some field has no fixed width (lists, maps)."""
    parts: list[np.ndarray] = []
    if not all(_fixed_width(pa.array([], f.type), parts, (0, 0)) for f in fields):
        return None
    return np.dtype(f"S{sum(p.shape[1] for p in parts)}")


def _is_bytes(t: pa.DataType) -> bool:
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t))


_U = np.uint64


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, on uint64 arrays (wrapping arithmetic): a bijection that
    spreads every input bit over the output."""
    x = (x ^ (x >> _U(30))) * _U(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> _U(27))) * _U(0x94D049BB133111EB)
    return x ^ (x >> _U(31))


def _hashed(arr: pa.Array, seeds: tuple[int, int]) -> np.ndarray:
    """(rows x 16) bytes: two 64-bit hashes of each value's bytes and length, one per seed
    (a null's are zero). The seeds are secret to the state that uses them, so keys cannot
    be chosen to collide; two values collide with probability 2**-128. The values are read
    8 bytes (a word) at a time, every value's next word at once, in numpy."""
    n = len(arr)
    if not n:
        return np.zeros((0, 16), np.uint8)
    wide = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    buffers = arr.buffers()
    offsets = np.frombuffer(buffers[1], np.int64 if wide else np.int32)[
        arr.offset: arr.offset + n + 1].astype(np.int64)
    data = (np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None
            else np.zeros(0, np.uint8))
    padded = np.concatenate([data, np.zeros(8, np.uint8)])
    # the little-endian word starting at each byte
    word_at = np.ndarray((len(padded) - 7,), dtype="<u8", buffer=padded, strides=(1,))
    starts, lengths = offsets[:-1], np.diff(offsets)
    hashes = [mix64(lengths.astype(_U) ^ _U(seed)) for seed in seeds]
    active = np.flatnonzero(lengths > 0)
    done = 0
    while len(active):
        word = word_at[starts[active] + done]
        left = lengths[active] - done
        short = np.flatnonzero(left < 8)   # a last word shorter than 8 bytes
        word[short] &= (_U(1) << (left[short] * 8).astype(_U)) - _U(1)
        every = len(active) == n   # (commonly the first word) no gather, no scatter
        for h in hashes:
            if every:
                h[:] = mix64(h ^ word)
            else:
                h[active] = mix64(h[active] ^ word)
        done += 8
        active = active[left > 8]
    out = np.stack(hashes, axis=1)
    out[~arr.is_valid().to_numpy(zero_copy_only=False)] = 0
    return out.view(np.uint8).reshape(n, 16)


def key_array(columns: Sequence[pa.Array], num_rows: int, dtype: np.dtype,
              seeds: tuple[int, int] = (0, 0)) -> np.ndarray:
    """The keys of these columns' rows in `key_dtype`'s form (strings and binaries hashed
    under `seeds`)."""
    if dtype == np.int64:
        column = columns[0]
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if column.null_count:
            raise ValueError(f"a null key in column of type {column.type} declared not null")
        if not pa.types.is_integer(column.type):
            column = column.view(pa.int64() if pa.types.is_timestamp(column.type)
                                 or pa.types.is_date64(column.type) else pa.int32())
        return column.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    parts: list[np.ndarray] = []
    for column in columns:
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        _fixed_width(column, parts, seeds)
    block = np.ascontiguousarray(np.concatenate(parts, axis=1)) if parts else \
        np.zeros((num_rows, 0), np.uint8)
    return block.view(dtype).ravel()


def _arrow_keys(keys: np.ndarray) -> pa.Array:
    """`key_array`'s keys as an Arrow array over the same memory; 8-byte keys as int64,
    whose hash table Arrow builds and probes in about two thirds of the time it takes
    for fixed-width binary (the same bytes: equal keys are equal words)."""
    if keys.dtype == np.int64:
        return pa.array(keys)
    if keys.dtype.itemsize == 8:
        return pa.array(np.ascontiguousarray(keys).view(np.int64))
    return _binary(np.ascontiguousarray(keys).view(np.uint8).reshape(len(keys), -1))


def is_in(keys: np.ndarray, of: np.ndarray) -> np.ndarray:
    """Whether each of `key_array`'s keys is among `of`'s (a bool array). Arrow's hash
    table compares their bytes: about 5x faster than `np.isin`, which sorts fixed-width
    bytes with string comparisons."""
    if not len(keys) or not len(of):
        return np.zeros(len(keys), bool)
    return pc.is_in(_arrow_keys(keys), value_set=_arrow_keys(of)).to_numpy(
        zero_copy_only=False)


def index_in(keys: np.ndarray, of: np.ndarray) -> np.ndarray:
    """Each of `key_array`'s keys' position among `of`'s (the first, if repeated), -1 where
    it is not there (Arrow's hash table, as `is_in`)."""
    if not len(keys) or not len(of):
        return np.full(len(keys), -1, np.int64)
    found = pc.index_in(_arrow_keys(keys), value_set=_arrow_keys(of))
    return pc.fill_null(found, -1).to_numpy(zero_copy_only=False).astype(np.int64)


def unique(keys: np.ndarray) -> np.ndarray:
    """`key_array`'s keys once each, in the order they first come (Arrow's hash table,
    not `np.unique`'s sort)."""
    if not len(keys):
        return keys
    once = pc.unique(_arrow_keys(keys))
    if keys.dtype == np.int64:
        return once.to_numpy(zero_copy_only=False)
    return np.frombuffer(once.buffers()[1], keys.dtype, len(once),
                         once.offset * keys.dtype.itemsize).copy()


def newest_of_each(keys: np.ndarray, first: bool = False) -> np.ndarray:
    """Positions that keep, for each distinct key, its last occurrence (its first, with
    `first`); in key order."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    keep = np.ones(len(order), dtype=bool)
    if first:
        keep[1:] = ordered[1:] != ordered[:-1]
    else:
        keep[:-1] = ordered[1:] != ordered[:-1]
    return order[keep]


def prefixes(keys: np.ndarray, width: int) -> np.ndarray:
    """The first `width` bytes of fixed-width byte keys, as keys of that width."""
    if keys.dtype.itemsize == width:
        return keys
    raw = np.ascontiguousarray(keys).view(np.uint8).reshape(len(keys), keys.dtype.itemsize)
    return np.ascontiguousarray(raw[:, :width]).view(f"S{width}").ravel()
