"""transformWithState (Row API) and transformWithStateInPandas, with the user's
StatefulProcessor in the worker that holds its state: every state operation is a dict
operation here, never a round trip to the JVM.

Semantics follow pyspark's worker and Spark's state variables (ValueStateImpl,
ListStateImpl, MapStateImpl):
- rows arrive sorted by grouping key; the processor is initialised once per task (its
  state variables registered), handleInputRows is called once per key with the key's rows
  (pandas: DataFrames of at most maxRecordsPerBatch rows; Row API: Rows), then close();
- a value handed to update/append/updateValue is stored as Spark stores it (numpy values
  made Python, then the state schema's conversion), so get() returns what it would return
  natively, in the same batch too;
- metrics as Spark counts them: an update, an appended value, a map entry written count as
  updated rows; a cleared value one removed row, a cleared list its values, a removed map
  entry one; numRowsTotal counts values, non-empty lists and map entries.
Timers (time modes ProcessingTime and EventTime) as pyspark's worker runs them: after
every key's rows, each timer at or before the batch's timestamp (ProcessingTime) or the
eviction watermark (EventTime) expires in timestamp order, handleExpiredTimer is called
with the key as a Row, then the timer is deleted (counted in numDeletedTimers, as Spark
counts it; Spark's Python path leaves numExpiredTimers at 0). Expiry pops a heap: it costs
what expires. In EventTime mode rows at or before the late-events watermark are dropped
and counted, as Spark drops them. State variables with a TTL: see _Variable. An initial
state arrives before the first batch's rows (`initial_state`): handleInitialState per key.
deleteIfExists in init() removes a variable it declared, or one only an earlier run declared
(its column goes from the files, as Spark removes its column family).

State layout: one row per grouping key and state variable: the grouping key columns and
`__state` (the variable's name) as key; one typed value column per variable (a struct for
a value, a list of structs for a list, a list of key/value structs for a map), null in the
other variables' rows. In memory each variable is a dict from grouping key to Python
values, kept with the partition's state between batches. A key's timers are one more such
variable, `$timers` (its sorted expiry times), in time modes that have timers. The files
name the value columns, so a processor may add variables between runs.

Spark's change feed of a variable (its RocksDB changelog) has a record per state operation:
an update (a value written, a list's first element on put, a map entry written), an append
(a list element appended, or put after the first) and a delete (a value or list cleared or
expired, a map entry removed, each entry of a cleared map). The family logs the operations
per key and variable in a batch, and writes them as change records in the delta (see
store.files), except the one write a put row already says (a single value update or list
put): `_write_changes`.
"""
from __future__ import annotations

import base64
import heapq
import itertools
import math
import time
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from .. import keys as keycodec
from ..store import VersionedState
from ..store import files as store_files
from ..store.files import CHANGE_APPEND, CHANGE_DELETE, CHANGE_UPDATE
from .base import FamilyBase, gather_rows
from .group_state_values import StateValueWriter, arrow_fields
from .pandas_io import PandasIO

STATE_NAME = "__state"
_NO_KEY = object()   # no grouping key is being processed (a key may be None)
VALUE, LIST, MAP, TIMERS = "value", "list", "map", "timers"
_SEQUENCE = itertools.count()   # heap entries' tie-break: unique, so keys are never compared
TIMER_VARIABLE = "$timers"   # "$" names are Spark's own column families, never a processor's
_COUNTED = ("numValueStateVars", "numListStateVars", "numMapStateVars",
            "numDeletedStateVars", "numValueStateWithTTLVars", "numListStateWithTTLVars",
            "numMapStateWithTTLVars", "numRegisteredTimers", "numDeletedTimers",
            "numExpiredTimers", "numValuesRemovedDueToTTLExpiry", "timerProcessingTimeMs",
            "initialStateProcessingTimeMs")


def is_map_type(t: pa.DataType) -> bool:
    """A map variable's column: a list of key/value structs."""
    return (pa.types.is_list(t) and pa.types.is_struct(t.value_type)
            and [f.name for f in t.value_type] == ["key", "value"])


def _struct_schema(schema, parsed: str | None):
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


class _Codec:
    """Python value tuples of one schema <-> Arrow, as Spark stores and returns them."""

    def __init__(self, schema, timezone: str) -> None:
        from pyspark.sql.conversion import ArrowTableToRowsConversion
        from pyspark.sql.streaming import stateful_processor_api_client as client
        client._load_numpy()   # pyspark's normaliser knows numpy only once this ran
        _normalize_state_value = client._normalize_state_value
        self.schema = schema
        self.fields = arrow_fields(schema, timezone)
        self.type = pa.struct(self.fields)
        self.writer = StateValueWriter(schema, self.fields)
        self._to_rows = ArrowTableToRowsConversion.convert
        self._normalize = _normalize_state_value

    def to_arrow(self, values: list) -> pa.StructArray:
        return pa.StructArray.from_arrays(self.writer.columns(values), fields=self.fields)

    def from_arrow(self, array: pa.StructArray) -> list[tuple]:
        if len(array) == 0:
            return []
        table = pa.Table.from_batches([pa.RecordBatch.from_struct_array(array)])
        return [tuple(v) for v in self._to_rows(table, self.schema, return_as_tuples=True)]

    def stored(self, value) -> tuple:
        """What Spark makes of a value handed to the state: numpy values made Python (as
        pyspark's client does), then the schema's conversion; exactly-typed plain values
        are already that."""
        if type(value) is tuple and self.writer.is_exact(value):
            return value
        if value is None:
            raise _state_error("a state value cannot be null")
        value = tuple(map(self._normalize, value))
        if self.writer.is_exact(value):
            return value
        return self.from_arrow(self.to_arrow([value]))[0]


def _as_from_rows(frame):
    """The dtypes pyspark's worker gives a key's DataFrame, which it builds from row tuples
    of Python scalars: narrower numpy integers and floats widen to 64 bits."""
    import numpy as np
    widened = {}
    for name, dtype in frame.dtypes.items():
        if isinstance(dtype, np.dtype) and dtype.kind in "iu" and dtype != np.int64:
            widened[name] = np.int64
        elif isinstance(dtype, np.dtype) and dtype.kind == "f" and dtype != np.float64:
            widened[name] = np.float64
    return frame.astype(widened) if widened else frame


def _offsets(lists: list) -> list[int]:
    offsets = [0]
    for values in lists:
        offsets.append(offsets[-1] + len(values))
    return offsets


def _state_error(what: str) -> Exception:
    from pyspark.errors import PySparkRuntimeError
    return PySparkRuntimeError(f"arrowstate: {what}")


class _TtlCodec:
    """A TTL variable's stored element: (value, expiry ms) <-> struct<value, expiresAtMs>."""

    def __init__(self, codec: _Codec) -> None:
        self.codec = codec
        self.fields = [pa.field("value", codec.type), pa.field("expiresAtMs", pa.int64())]
        self.type = pa.struct(self.fields)

    def to_arrow(self, elements: list) -> pa.StructArray:
        return pa.StructArray.from_arrays(
            [self.codec.to_arrow([v for v, _ in elements]),
             pa.array([e for _, e in elements], pa.int64())], fields=self.fields)

    def from_arrow(self, array: pa.StructArray) -> list[tuple]:
        values, expiries = array.flatten()
        return list(zip(self.codec.from_arrow(values), expiries.to_pylist()))


class _Variable:
    """One state variable: its kind, schemas, Arrow column and in-memory elements (grouping
    key -> element | list of elements | dict of user key -> element), an element being the
    value tuple, or (value tuple, expiry ms) with a TTL.

    With a TTL (Spark's ValueStateImplWithTTL, ListStateImplWithTTL, MapStateImplWithTTL)
    an element expires at the batch timestamp of its last write plus the TTL: from a batch
    whose timestamp reaches that, reads skip it, and at the end of the batch it is removed
    (counted as removed rows and in numValuesRemovedDueToTTLExpiry). A heap of (expiry,
    sequence, element key) finds what expires without a scan of the state."""

    def __init__(self, family: "TransformWithState", name: str, kind: str, schema,
                 key_schema=None, ttl_ms: int | None = None) -> None:
        self.family, self.name, self.kind, self.ttl = family, name, kind, ttl_ms
        self.codec = _Codec(schema, family.io.timezone)
        self.store_codec = self.codec if ttl_ms is None else _TtlCodec(self.codec)
        self.key_codec = None if key_schema is None else _Codec(key_schema, family.io.timezone)
        if kind == VALUE:
            self.type = self.store_codec.type
        elif kind == LIST:
            self.type = pa.list_(self.store_codec.type)
        else:
            self.type = pa.list_(pa.struct([pa.field("key", self.key_codec.type),
                                            pa.field("value", self.store_codec.type)]))
        self.data: dict = {}
        self.clients: list = []   # the processor's handles on it (deleteIfExists swaps them)
        self.now = family.timer_values.getCurrentProcessingTimeInMs()
        self.expiry = None if ttl_ms is None else self.now + ttl_ms
        self.index: list = []     # TTL: heap of (expiry, sequence, element key)
        self._indexed = 0         # TTL: heap size after its last rebuild
        self._written_key, self._written = _NO_KEY, None   # _changed's last key, this batch

    # -- what the processor calls, for the current grouping key -----------------------------
    def _key(self):
        return self.family.current_key()

    def _changed(self, key) -> list:
        """Marks the key's value as written in this batch; its operations (see logged).
        The last key's are at hand: a processor works on one key at a time."""
        if key is self._written_key:
            return self._written
        records = self.family.dirty.get((self.name, key))
        if records is None:
            records = self.family.dirty[(self.name, key)] = []
        self._written_key, self._written = key, records
        return records

    def logged(self, key, op: int, payload=None) -> None:
        """Notes a state operation for the change feed, as an op and its payload: an
        element or None (value: update, delete), a list of elements (list: put), an element
        (list: append), None (list: delete). Flat, two items an operation (a map's three:
        see logged_entry), so that a write costs no container of its own."""
        records = self._changed(key)
        records.append(op)
        records.append(payload)

    def logged_entry(self, key, op: int, user_key, element=None) -> None:
        """Notes a map operation: an entry written, or removed (no element)."""
        records = self._changed(key)
        records.append(op)
        records.append(user_key)
        records.append(element)

    def entries(self, key) -> int:
        """Rows Spark counts for the key: a value, a list, each map entry."""
        return self.entries_of(self.data.get(key))

    def entries_of(self, value) -> int:
        return 0 if value is None else (len(value) if self.kind == MAP else 1)

    def _set(self, key, value) -> None:
        before = self.entries(key)
        if value is None or (self.kind != VALUE and not value):
            self.data.pop(key, None)
        else:
            self.data[key] = value
        self.family.total += self.entries(key) - before
        self._changed(key)

    # -- TTL ---------------------------------------------------------------------------------
    def element(self, stored: tuple):
        """What is kept for a value written now."""
        return stored if self.ttl is None else (stored, self.expiry)

    def visible(self, element):
        """The value a read returns (None once its TTL has passed)."""
        if element is None or self.ttl is None:
            return element
        return element[0] if element[1] > self.now else None

    def indexed(self, element_key) -> None:
        """Notes that `element_key` holds an element written now (TTL only)."""
        heapq.heappush(self.index, (self.expiry, next(_SEQUENCE), element_key))

    def attach_index(self, index: list) -> None:
        self.index = index
        if not index and self.data:
            self._rebuild_index()

    def _rebuild_index(self) -> None:
        if self.kind == MAP:
            entries = [(e[1], next(_SEQUENCE), (g, k)) for g, m in self.data.items()
                       for k, e in m.items()]
        else:
            entries = [(e[1] if self.kind == VALUE else min(x[1] for x in e), next(_SEQUENCE),
                        g) for g, e in self.data.items()]
        self.index[:] = entries
        heapq.heapify(self.index)
        self._indexed = len(entries)

    def expire(self) -> int:
        """Removes the elements whose TTL has passed; how many (Spark's count)."""
        index, now, data, removed = self.index, self.now, self.data, 0
        while index and index[0][0] <= now:
            _, _, element_key = heapq.heappop(index)
            if self.kind == MAP:
                group, user_key = element_key
                entries = data.get(group)
                if entries is not None and user_key in entries and entries[user_key][1] <= now:
                    _remove_entry(self, group, entries, user_key)
                    self.logged_entry(group, CHANGE_DELETE, user_key)
                    removed += 1
            elif self.kind == LIST:
                values = data.get(element_key)
                if values:
                    kept = [e for e in values if e[1] > now]
                    if len(kept) < len(values):
                        removed += len(values) - len(kept)
                        self._set(element_key, kept)
                        # Spark's cleanup removes the list, then puts what is left
                        self.logged(element_key, CHANGE_DELETE)
                        if kept:
                            self.logged(element_key, CHANGE_UPDATE, list(kept))
            else:
                element = data.get(element_key)
                if element is not None and element[1] <= now:
                    self._set(element_key, None)
                    self.logged(element_key, CHANGE_DELETE)
                    removed += 1
        if len(index) > 2 * self._indexed + 1024:   # mostly superseded entries
            self._rebuild_index()
        return removed


def _remove_entry(var: _Variable, group, entries: dict, user_key) -> None:
    if len(entries) == 1:
        var._set(group, None)
    else:
        del entries[user_key]
        var.family.total -= 1
        var._changed(group)


def _change_rows(kind: str, records: list) -> Iterator[tuple[int, Any]]:
    """A key's logged operations as change records: one per value operation, list put or
    list delete; a run of list appends as one record of their elements, a run of map
    operations of one kind as one record of their (user key, element or None) pairs."""
    if kind == MAP:
        ops, payloads = records[0::3], zip(records[1::3], records[2::3])
    else:
        ops, payloads = records[0::2], records[1::2]
    run_op, run = None, []
    for op, payload in zip(ops, payloads):
        merges = kind == MAP or (kind == LIST and op == CHANGE_APPEND)
        if run and (not merges or op != run_op):
            yield run_op, run
            run = []
        if merges:
            run_op = op
            run.append(payload)
        else:
            yield op, payload
    if run:
        yield run_op, run


def _change_column(var: _Variable, payloads: list) -> pa.Array:
    """Change records' payloads (see _Variable.logged) as the variable's column: a value or
    a list of elements (null: a delete), a map's entries (a delete's with null values)."""
    if var.kind == VALUE:
        return _with_nulls(var, payloads)
    lists = [p or [] for p in payloads]
    if var.kind == LIST:
        items = var.store_codec.to_arrow([e for lst in lists for e in lst])
    else:
        pairs = [e for lst in lists for e in lst]
        items = pa.StructArray.from_arrays(
            [var.key_codec.to_arrow([k for k, _ in pairs]),
             _with_nulls(var, [v for _, v in pairs])], fields=list(var.type.value_type))
    return pa.ListArray.from_arrays(pa.array(_offsets(lists), pa.int32()), items,
                                    type=var.type,
                                    mask=pa.array([p is None for p in payloads]))


def _with_nulls(var: _Variable, elements: list) -> pa.Array:
    """Stored elements as Arrow, None as null."""
    at = itertools.count()
    indices = pa.array([None if e is None else next(at) for e in elements], pa.int32())
    return var.store_codec.to_arrow([e for e in elements if e is not None]).take(indices)


def _deleted_client(client_class: type, errors: dict[str, str]) -> type:
    """The class a deleted variable's client takes (deleteIfExists): each operation fails
    as pyspark's client fails on the column family Spark removed."""
    def failing(method: str, what: str):
        def fail(self, *_args):
            from pyspark.errors import PySparkRuntimeError
            raise PySparkRuntimeError(
                f"Error {what}: [STATE_STORE_UNSUPPORTED_OPERATION_ON_MISSING_COLUMN_FAMILY] "
                f"the state variable {self.var.name} was deleted by deleteIfExists")
        fail.__name__ = method
        return fail
    return type(f"Deleted{client_class.__name__}", (client_class,),
                {m: failing(m, what) for m, what in errors.items()})


class _ValueClient:
    def __init__(self, var: _Variable) -> None:
        self.var = var
        var.clients.append(self)

    def exists(self, _name: str) -> bool:
        var = self.var
        return var.visible(var.data.get(var._key())) is not None

    def get(self, _name: str):
        var = self.var
        return var.visible(var.data.get(var._key()))

    def update(self, _name: str, value) -> None:
        var = self.var
        key = var._key()
        stored = var.codec.stored(value)
        family = var.family
        if var.ttl is None:   # the common case, inline: a dict write and its bookkeeping
            data = var.data
            if key not in data:
                family.total += 1
            data[key] = stored
            family.metrics["numUpdatedStateRows"] += 1
            records = var._written if key is var._written_key else var._changed(key)
            records.append(CHANGE_UPDATE)
            records.append(stored)
            return
        element = var.element(stored)
        if var.data.get(key) == element:   # with a TTL Spark writes (and counts) a change
            return
        var.family.metrics["numUpdatedStateRows"] += 1
        var.indexed(key)
        var.logged(key, CHANGE_UPDATE, element)
        var._set(key, element)

    def clear(self, _name: str) -> None:
        var = self.var
        key = var._key()
        if var.ttl is None or key in var.data:   # with a TTL Spark counts what was there
            var.family.metrics["numRemovedStateRows"] += 1
        var._set(key, None)
        var.logged(key, CHANGE_DELETE)


class _ListClient:
    def __init__(self, var: _Variable) -> None:
        self.var = var
        var.clients.append(self)

    def exists(self, _name: str) -> bool:
        var = self.var
        if var.ttl is None:
            return var._key() in var.data
        return any(e[1] > var.now for e in var.data.get(var._key(), ()))

    def values(self) -> Iterator[tuple]:
        var = self.var
        elements = var.data.get(var._key(), ())
        if var.ttl is None:
            return iter(list(elements))
        return iter([v for v, expiry in elements if expiry > var.now])

    def _checked(self, values) -> list:
        if values is None:
            raise _state_error(f"the list state {self.var.name} cannot be set to null")
        values = list(values)
        if not values:
            raise _state_error(f"the list state {self.var.name} cannot be set to an empty "
                               "list (clear() removes it)")
        var = self.var
        return [var.element(var.codec.stored(v)) for v in values]

    def put(self, _name: str, values) -> None:
        var, stored = self.var, self._checked(values)
        key = var._key()
        var._set(key, stored)
        var.logged(key, CHANGE_UPDATE, list(stored))
        if var.ttl is None:
            # Spark's ListStateImpl.put resets the task's updated-rows count, then counts
            var.family.metrics["numUpdatedStateRows"] = len(stored)
        else:
            var.family.metrics["numUpdatedStateRows"] += len(stored)
            var.indexed(key)

    def append_value(self, _name: str, value) -> None:
        var = self.var
        element = var.element(var.codec.stored(value))
        key = var._key()
        current = var.data.get(key)
        if current is None:
            var._set(key, [element])
        else:
            current.append(element)
        var.logged(key, CHANGE_APPEND, element)
        var.family.metrics["numUpdatedStateRows"] += 1
        if var.ttl is not None:
            var.indexed(key)

    def append_list(self, _name: str, values) -> None:
        var, stored = self.var, self._checked(values)
        key = var._key()
        current = var.data.get(key)
        if current is None:
            var._set(key, stored)
        else:
            current.extend(stored)
        var._changed(key).extend(itertools.chain.from_iterable(
            (CHANGE_APPEND, element) for element in stored))
        var.family.metrics["numUpdatedStateRows"] += len(stored)
        if var.ttl is not None:
            var.indexed(key)

    def clear(self, _name: str) -> None:
        var = self.var
        key = var._key()
        removed = len(var.data.get(key, ()))
        var._set(key, None)
        var.logged(key, CHANGE_DELETE)
        var.family.metrics["numRemovedStateRows"] += removed


class _MapClient:
    def __init__(self, var: _Variable) -> None:
        self.var = var
        var.clients.append(self)

    def _map(self) -> dict:
        var = self.var
        entries = var.data.get(var._key(), {})
        if var.ttl is None:
            return entries
        return {k: v for k, (v, expiry) in entries.items() if expiry > var.now}

    def exists(self, _name: str) -> bool:
        return bool(self._map())

    def get_value(self, _name: str, key):
        return self._map().get(self.var.key_codec.stored(key))

    def contains_key(self, _name: str, key) -> bool:
        return self.var.key_codec.stored(key) in self._map()

    def update_value(self, _name: str, key, value) -> None:
        var = self.var
        user_key, element = var.key_codec.stored(key), var.element(var.codec.stored(value))
        group = var._key()
        entries = var.data.get(group)
        if var.ttl is not None and entries is not None and entries.get(user_key) == element:
            return   # with a TTL Spark writes (and counts) a change only
        var.family.metrics["numUpdatedStateRows"] += 1
        var.logged_entry(group, CHANGE_UPDATE, user_key, element)
        if var.ttl is not None:
            var.indexed((group, user_key))
        if entries is None:
            var._set(group, {user_key: element})
        else:
            var.family.total += user_key not in entries
            entries[user_key] = element

    def remove_key(self, _name: str, key) -> None:
        var = self.var
        user_key, group = var.key_codec.stored(key), var._key()
        entries = var.data.get(group)
        if entries is not None and user_key in entries:
            _remove_entry(var, group, entries, user_key)
        # Spark records it, present or not
        var.logged_entry(group, CHANGE_DELETE, user_key)
        var.family.metrics["numRemovedStateRows"] += 1

    def clear(self, _name: str) -> None:
        var = self.var
        group = var._key()
        entries = var.data.get(group, {})
        for k in entries:
            var.logged_entry(group, CHANGE_DELETE, k)
        var._set(group, None)
        var.family.metrics["numRemovedStateRows"] += len(entries)

    def items(self) -> list:
        return list(self._map().items())


# pyspark's client errors, by operation
_DELETED_CLIENTS = {
    _ValueClient: _deleted_client(_ValueClient, {
        "exists": "checking value state exists", "get": "getting value state",
        "update": "updating value state", "clear": "clearing value state"}),
    _ListClient: _deleted_client(_ListClient, {
        "exists": "checking value state exists", "values": "getting list state",
        "put": "updating value state", "append_value": "updating value state",
        "append_list": "updating value state",
        "clear": "clearing value state"}),
    _MapClient: _deleted_client(_MapClient, {
        "exists": "checking map state exists", "get_value": "getting value",
        "contains_key": "checking if map state contains key",
        "update_value": "updating map state value",
        "remove_key": "removing key from map state", "clear": "clearing map state",
        "items": "getting map state iterator"}),
}


class _Timers:
    """The timers of every grouping key: `data` (key -> sorted expiry times, stored as the
    `$timers` variable) and a heap of (time, sequence, key) over them for expiry. Deleted
    timers stay in the heap until popped (skipped then) or until the heap is rebuilt, which
    happens when stale entries outnumber live ones."""

    kind, name, ttl = TIMERS, TIMER_VARIABLE, None

    def __init__(self, family: "TransformWithState") -> None:
        self.family = family
        self.type = pa.list_(pa.int64())
        self.data: dict = {}
        self.heap: list = []
        self.live = 0

    def entries_of(self, _value) -> int:
        return 0   # timers are not state rows in Spark's figures

    def attach(self, data: dict, heap: list) -> None:
        """Takes the partition's timers; `heap` is the list kept with them between batches
        (empty after a load from files: then it is built here)."""
        self.data, self.heap = data, heap
        self.live = sum(map(len, data.values()))
        if len(heap) < self.live:
            self._rebuild()

    def _rebuild(self) -> None:
        self.heap[:] = [(ts, next(_SEQUENCE), g) for g, times in self.data.items()
                        for ts in times]
        heapq.heapify(self.heap)

    def register(self, ts: int) -> None:
        family = self.family
        group = family.current_key()
        times = self.data.setdefault(group, [])
        family.metrics["numRegisteredTimers"] += 1
        if ts in times:
            return   # Spark logs a warning and keeps the one timer
        times.append(ts)
        times.sort()
        self.live += 1
        heapq.heappush(self.heap, (ts, next(_SEQUENCE), group))
        family.dirty[(TIMER_VARIABLE, group)] = None

    def delete(self, ts: int, group=None) -> None:
        family = self.family
        group = family.current_key() if group is None else group
        family.metrics["numDeletedTimers"] += 1   # counted whether or not it existed
        times = self.data.get(group)
        if not times or ts not in times:
            return
        times.remove(ts)
        if not times:
            del self.data[group]
        self.live -= 1
        family.dirty[(TIMER_VARIABLE, group)] = None
        if len(self.heap) > 2 * self.live + 1024:
            self._rebuild()

    def list(self) -> Iterator[int]:
        return iter(list(self.data.get(self.family.current_key(), ())))

    def expired(self, threshold: int) -> list[tuple[int, Any]]:
        """Live timers at or before `threshold`, in time order, taken off the heap at once:
        as Spark's iterator over its timer index, one made before any handler runs."""
        heap, due, seen = self.heap, [], set()
        while heap and heap[0][0] <= threshold:
            ts, _, group = heapq.heappop(heap)
            if (ts, group) not in seen and ts in self.data.get(group, ()):
                seen.add((ts, group))
                due.append((ts, group))
        return due


def _map_state(var: _Variable):
    """pyspark's MapState, whose iterators here are over the current key's entries."""
    from pyspark.sql.streaming.stateful_processor import MapState

    class LocalMapState(MapState):
        def iterator(self):
            return iter(self._mapStateClient.items())

        def keys(self):
            return iter([k for k, _ in self._mapStateClient.items()])

        def values(self):
            return iter([v for _, v in self._mapStateClient.items()])

    return LocalMapState(_MapClient(var), var.name)


def _list_state(var: _Variable):
    """pyspark's ListState, whose iterator is over the current key's values."""
    from pyspark.sql.streaming.stateful_processor import ListState

    class LocalListState(ListState):
        def get(self):
            return self._listStateClient.values()

    return LocalListState(_ListClient(var), var.name)


def _handle(family: "TransformWithState"):
    """The processor's StatefulProcessorHandle, with state variables held here."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessorHandle, ValueState

    def ttl_ms(name: str, ttl) -> int | None:
        """As Spark reads a TTLConfig: none or zero is no TTL; a TTL needs ProcessingTime."""
        if not ttl:
            return None
        if family.time_mode != "ProcessingTime":
            raise _state_error(f"state variable {name}: a TTL needs time mode ProcessingTime "
                               f"(Spark: cannotProvideTTLConfigForTimeMode), not "
                               f"{family.time_mode}")
        if ttl < 0:
            raise _state_error(f"state variable {name}: the TTL must be positive, not {ttl}")
        return int(ttl)

    def timers() -> _Timers:
        if family.timers is None:
            raise _state_error("timers need time mode ProcessingTime or EventTime (Spark: "
                               "STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_TIME_"
                               "MODE); this query runs with time mode None")
        return family.timers

    class LocalHandle(StatefulProcessorHandle):
        def __init__(self) -> None:
            """No API client: the family holds the state (pyspark's handle needs one)."""

        def getValueState(self, stateName, schema, ttlDurationMs=None):
            return ValueState(_ValueClient(family.register(
                stateName, VALUE, schema, ttl_ms=ttl_ms(stateName, ttlDurationMs))), stateName)

        def getListState(self, stateName, schema, ttlDurationMs=None):
            return _list_state(family.register(stateName, LIST, schema,
                                               ttl_ms=ttl_ms(stateName, ttlDurationMs)))

        def getMapState(self, stateName, userKeySchema, valueSchema, ttlDurationMs=None):
            return _map_state(family.register(stateName, MAP, valueSchema, userKeySchema,
                                              ttl_ms=ttl_ms(stateName, ttlDurationMs)))

        def registerTimer(self, expiryTimestampMs: int) -> None:
            timers().register(int(expiryTimestampMs))

        def deleteTimer(self, expiryTimestampMs: int) -> None:
            timers().delete(int(expiryTimestampMs))

        def listTimers(self) -> Iterator[int]:
            return timers().list()

        def deleteIfExists(self, stateName):
            family.delete_variable(stateName)

    return LocalHandle()


class TransformWithState(FamilyBase):
    name = "transformWithState"
    named_columns = True   # a processor may add state variables between runs, as in Spark

    def __init__(self, operator: dict[str, Any], input_schema: pa.Schema):
        super().__init__(operator, ("numUpdatedStateRows", "numRemovedStateRows",
                                    "numTotalStateRows", "numRowsDroppedByWatermark",
                                    "allUpdatesTimeMs", "allRemovalsTimeMs") + _COUNTED)
        from pyspark.serializers import CloudPickleSerializer
        from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues
        from pyspark.sql.types import Row

        self._Row, self._ExpiredTimerInfo = Row, ExpiredTimerInfo
        # Spark's name of time mode None is NoTime
        mode = operator.get("timeMode", "None")
        self.time_mode = "None" if mode == "NoTime" else mode
        batch_ms, watermark_ms = operator.get("batchTimestampMs"), operator.get(
            "evictionWatermarkMs")
        # what pyspark's worker hands the processor: -1 for what a time mode leaves unknown
        self.timer_values = (TimerValues(-1, -1) if self.time_mode == "None" else TimerValues(
            -1 if batch_ms is None else batch_ms, -1 if watermark_ms is None else watermark_ms))
        self.expiry_threshold = (self.timer_values.getCurrentProcessingTimeInMs()
                                 if self.time_mode == "ProcessingTime"
                                 else self.timer_values.getCurrentWatermarkInMs())
        self.event_time_index = operator.get("eventTimeIndex", -1)
        self.io = PandasIO(operator)
        udf, _ = CloudPickleSerializer().loads(base64.b64decode(operator["command"]))
        self.processor = udf.__self__._stateful_processor
        self.pandas = operator["pandas"]
        self.key_indices = operator["keyIndices"]
        self.value_indices = operator["valueIndices"]
        self.initial_key_count = operator.get("initialKeyCount")
        # pyspark's worker: at most this many rows per DataFrame (none when not positive),
        # and, when a bytes limit is set, rows x average Arrow row size under it
        records = operator["maxRecordsPerBatch"]
        self.max_rows = records if records > 0 else 2**31 - 1
        self.max_bytes = operator.get("maxBytesPerBatch", 2**31 - 1)
        self._seen_bytes = self._seen_rows = 0
        self._output_schema = None   # Row API: the Arrow schema pyspark's worker writes
        self._output_rows: list[dict] = []   # Row API: the processor's rows as dicts
        self._attached = False
        self.key_fields = [input_schema.field(i) for i in self.key_indices] + [
            pa.field(STATE_NAME, pa.string())]
        self.variables: dict[str, _Variable] = {}
        self._parsed: dict = operator["variables"]
        # (variable, grouping key) -> its state operations this batch (_Variable.logged), in
        # the order keys were first written
        self.dirty: dict = {}
        self.total = 0
        self._current = _NO_KEY                # the grouping key being processed
        self._key_rows: dict = {}              # grouping key -> (key batch, row) this batch
        self._pending = None   # the batch's last key, whose rows may go on in the next one
        self._initial_pending = None   # likewise for the initial state's rows
        self._initial_ns = 0
        self.timers = None if self.time_mode == "None" else _Timers(self)
        # With timers or TTLs a key's state changes in batches without its rows: the key
        # columns of every key with state are kept, key -> (key batch, row)
        self.held_keys: dict = {}
        self.deleted: list[_Variable] = []   # variables init() deleted (deleteIfExists)
        self.deleted_undeclared: list[str] = []   # deleted without a declaration this run
        self.dropped: list[str] = []   # of those, the ones the files held: dropped on load
        self._initialized = False
        self.processor.init(_handle(self))
        self._initialized = True
        if self.timers is not None:
            self.variables[TIMER_VARIABLE] = self.timers
        self.order = sorted(self.variables)
        self.holds_keys = self.timers is not None or any(
            v.ttl is not None for v in self.variables.values())
        self.value_fields = [pa.field(f"s_{n}", self.variables[n].type) for n in self.order]
        self.orphans: list[str] = []   # variables the files hold and init() does not declare

    def register(self, name: str, kind: str, schema, key_schema=None,
                 ttl_ms: int | None = None) -> _Variable:
        if name in self.variables:
            raise _state_error(f"state variable {name} is defined twice")
        parsed = self._parsed.get(name, {})
        var = _Variable(self, name, kind, _struct_schema(schema, parsed.get("value")),
                        None if key_schema is None
                        else _struct_schema(key_schema, parsed.get("userKey")), ttl_ms)
        self.variables[name] = var
        counted = {VALUE: "numValueState", LIST: "numListState", MAP: "numMapState"}[kind]
        self.metrics[counted + ("Vars" if ttl_ms is None else "WithTTLVars")] += 1
        return var

    def delete_variable(self, name: str) -> None:
        """deleteIfExists in init(): the variable's state goes at the batch's start, and
        any later use of it fails. Spark counts a deleted variable when its column family
        exists, which a getXState call earlier in init() creates."""
        if self._initialized:
            raise _state_error(f"deleteIfExists({name!r}) can only be called in init() "
                               "(Spark: STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_"
                               "INVALID_HANDLE_STATE)")
        var = self.variables.get(name)
        if var is None:   # a variable of an earlier run, if the files hold it: keep_columns
            self.deleted_undeclared.append(name)
            return
        self.deleted.append(var)
        self.metrics["numDeletedStateVars"] += 1

    def keep_columns(self, stored: pa.Schema) -> None:
        """A variable the files hold and this run's init() no longer declares stays, as in
        Spark (its column family stays): its rows are kept as they are and counted in
        numTotalStateRows, and its column comes after the declared ones. Unless init()
        deleted it (deleteIfExists): then its column goes, as Spark removes its column
        family, and its rows with it once loaded (`_attach`)."""
        have = {f.name for f in self.value_fields}
        for f in stored:
            name = (f.metadata or {}).get(store_files.COLUMN_NAME, b"").decode()
            if not name or name in have:
                continue
            have.add(name)
            if name[2:] in self.deleted_undeclared:
                self.dropped.append(name[2:])
                self.metrics["numDeletedStateVars"] += 1
            else:
                self.value_fields.append(pa.field(name, f.type))
                self.orphans.append(name[2:])

    def _orphan_entries(self, rows: pa.RecordBatch, names: list) -> int:
        """Rows Spark counts of the variables kept without a declaration: a value or a list
        one, a map its entries (the column's type tells a map: a list of key/value structs),
        timers none."""
        nk, total = len(self.key_fields) - 1, 0
        for j, name in enumerate(self.orphans, start=len(self.order)):
            picked = [i for i, n in enumerate(names) if n == name]
            if not picked or name == TIMER_VARIABLE:
                continue
            column = rows.column(nk + 1 + j).take(pa.array(picked))
            total += (pc.sum(pc.list_value_length(column)).as_py() or 0
                      if is_map_type(column.type) else len(picked))
        return total

    def current_key(self):
        if self._current is _NO_KEY:
            raise _state_error("state is only available while a grouping key is processed "
                               "(handleInputRows)")
        return self._current

    # -- state between batches --------------------------------------------------------------
    def rebuild_index(self, state: VersionedState) -> None:
        """Loads the variables' values from the stored rows (after a load from files)."""
        rows = state.rows.take(state.rows.live_ids())
        nk = len(self.key_fields) - 1
        groups = keycodec.rows(rows.columns[:nk], rows.num_rows)
        names = rows.column(nk).to_pylist()
        data = {n: {} for n in self.order}
        for column, name in enumerate(self.order):
            var = self.variables[name]
            picked = [i for i, n in enumerate(names) if n == name]
            if not picked:
                continue
            values = rows.column(nk + 1 + column).take(pa.array(picked))
            if var.kind == VALUE:
                decoded = var.store_codec.from_arrow(values)
            elif var.kind == TIMERS:
                decoded = values.to_pylist()
            else:
                flat = var.store_codec.from_arrow(values.flatten() if var.kind == LIST
                                            else values.flatten().field("value"))
                keys = (var.key_codec.from_arrow(values.flatten().field("key"))
                        if var.kind == MAP else None)
                offsets = values.offsets.to_pylist()
                decoded = [flat[a:b] if keys is None else dict(zip(keys[a:b], flat[a:b]))
                           for a, b in zip(offsets[:-1], offsets[1:])]
            for i, value in zip(picked, decoded):
                data[name][groups[i]] = value
        unknown = set(names) - set(self.order) - set(self.orphans) - set(self.dropped)
        if unknown:
            raise _state_error(f"the stored state holds variables {sorted(unknown)} that "
                               "the processor does not define")
        total = sum(self.variables[n].entries_of(v) for n, d in data.items() for v in d.values())
        total += self._orphan_entries(rows, names)
        key_batch = rows.select(range(nk))
        held_keys = ({g: (key_batch, i) for i, g in enumerate(groups)} if self.holds_keys
                     else {})
        state.objects = {"variables": data, "total": total, "timerHeap": [],
                         "heldKeys": held_keys, "ttlIndexes": {}}

    def _attach(self, state: VersionedState) -> None:
        if self._attached:
            return
        self._attached = True
        held = getattr(state, "objects", None)
        if held is None or set(held["variables"]) != set(self.order):
            self.rebuild_index(state)
            held = state.objects
        for name, var in self.variables.items():
            if var is not self.timers:
                var.data = held["variables"][name]
            if var.ttl is not None:
                var.attach_index(held["ttlIndexes"].setdefault(name, []))
        if self.timers is not None:
            self.timers.attach(held["variables"][TIMER_VARIABLE], held["timerHeap"])
        self.held_keys = held["heldKeys"]
        self.total = held["total"]
        for var in self.deleted:
            self._drop_variable(state, var)
        if self.dropped:
            self._drop_rows(state, self.dropped)

    @property
    def dropped_columns(self) -> tuple[str, ...]:
        return tuple(f"s_{n}" for n in self.dropped)

    def _drop_rows(self, state: VersionedState, names: list[str]) -> None:
        """Removes the stored rows of variables whose columns went (a scan, once)."""
        rows = state.rows.take(state.rows.live_ids())
        nk = len(self.key_fields) - 1
        mine = rows.filter(pc.is_in(rows.column(nk), pa.array(names, pa.string())))
        if mine.num_rows:
            state.pop_present(keycodec.rows(mine.columns[:nk + 1], mine.num_rows))

    def _drop_variable(self, state: VersionedState, var: _Variable) -> None:
        """Removes every stored row of a deleted variable (a scan, once: after it there are
        none) and makes later uses of it fail."""
        if var.data:
            self._drop_rows(state, [var.name])
            self.total -= sum(map(var.entries_of, var.data.values()))
            var.data.clear()
        for client in var.clients:
            client.__class__ = _DELETED_CLIENTS[type(client)]

    # -- one micro-batch --------------------------------------------------------------------
    def process(self, state: VersionedState, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        self._attach(state)
        with self.updating():
            self._seed()
            self._process(batch)
        return self._output()

    def _process(self, batch: pa.RecordBatch) -> None:
        if self.late_threshold is not None and self.event_time_index >= 0:
            late = self.late_mask(*keycodec.event_time_micros(
                batch.column(self.event_time_index)))
            if late.any():   # EventTime mode: Spark drops rows the watermark has passed
                batch = batch.filter(pa.array(~late))
        for group, key_columns, key, items in self._keys_of(
                batch, self.key_indices, self.value_indices):
            pending = self._pending
            if pending is not None and pending[0] == group:
                pending[2].extend(items)   # the key's rows continue from the last batch
                pending[3] = True
                continue
            if pending is not None:
                self._call(*pending)
            self._key_rows[group] = key_columns
            self._pending = [group, key, items, False]

    def _keys_of(self, batch: pa.RecordBatch, key_indices: list[int],
                 value_indices: list[int]) -> Iterator[tuple]:
        """Per key of a batch sorted by key: the key (hashable), where its columns are,
        the key as the processor gets it, and its rows as the processor gets them (pandas:
        DataFrames of at most maxRecordsPerBatch rows; Row API: Rows)."""
        n = batch.num_rows
        if n == 0:
            return
        key_batch = batch.select(key_indices)
        groups = keycodec.rows(key_batch.columns, n)
        bounds = [0] + [i for i in range(1, n) if groups[i] != groups[i - 1]] + [n]
        if self.pandas:
            series = self.io.to_pandas(batch)
            frame = _as_from_rows(self.io._pd.concat([series[i] for i in value_indices],
                                                     axis=1))
            # as pyspark's worker makes them: Python scalars, from pandas
            keys = [series[i].tolist() for i in key_indices]
            if self.max_bytes != 2**31 - 1:
                self._seen_bytes += sum(b.size for c in batch.columns for b in c.buffers()
                                        if b is not None)
                self._seen_rows += n
        else:   # Python values once per batch: what as_py() per cell gives pyspark's worker
            columns = [batch.column(i).to_pylist() for i in value_indices]
            keys = [batch.column(i).to_pylist() for i in key_indices]
            DataRow = self._Row(*(batch.schema.names[i] for i in value_indices))
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            if self.pandas:
                items = self._chunks(frame, lo, hi)
            else:
                items = [DataRow(*(c[i] for c in columns)) for i in range(lo, hi)]
            yield groups[lo], (key_batch, lo), tuple(k[lo] for k in keys), items

    def _whole_key(self, items: list, spans_batches: bool) -> list:
        """A key's rows as the processor gets them: DataFrames from two Arrow batches are
        joined and cut anew from the key's start, as pyspark's worker cuts them."""
        if spans_batches and self.pandas:
            return self._chunks(self.io._pd.concat(items, ignore_index=True), 0, None)
        return items

    def _chunks(self, frame, lo: int, hi: int | None) -> list:
        """Rows lo..hi of a frame as the DataFrames pyspark's worker hands over."""
        hi = len(frame) if hi is None else hi
        size = self.max_rows
        if self.max_bytes != 2**31 - 1 and self._seen_rows:
            average = self._seen_bytes / self._seen_rows
            size = min(size, max(1, math.ceil(self.max_bytes / average)))
        chunks = []
        for start in range(lo, hi, size):
            chunk = frame.iloc[start:min(hi, start + size)]
            chunk.index = self.io._pd.RangeIndex(len(chunk))
            chunks.append(chunk)
        return chunks

    def initial_state(self, state: VersionedState, batch: pa.RecordBatch) -> None:
        """A batch of the initial state (the query's first batch, before any input rows):
        handleInitialState per key, per DataFrame (pandas) or per Row; a key whose rows go
        on in the next batch is called once they have all come, as for input rows."""
        self._attach(state)
        before, start = self._initial_ns, time.perf_counter_ns()
        k = self.initial_key_count
        with self.updating():
            for group, key_columns, key, items in self._keys_of(
                    batch, list(range(k)), list(range(k, batch.num_columns))):
                pending = self._initial_pending
                if pending is not None and pending[0] == group:
                    pending[2].extend(items)
                    pending[3] = True
                    continue
                self._seed()
                self._key_rows.setdefault(group, key_columns)
                self._initial_pending = [group, key, items, False]
        # the keys seeded here are in this time already
        self._initial_ns = before + time.perf_counter_ns() - start
        self.metrics["initialStateProcessingTimeMs"] = self._initial_ns // 1_000_000

    def _seed(self) -> None:
        """handleInitialState for the last key of the initial state seen so far."""
        if self._initial_pending is None:
            return
        start = time.perf_counter_ns()
        group, key, items, spans_batches = self._initial_pending
        self._initial_pending = None
        items = self._whole_key(items, spans_batches)
        self._current = group
        for item in items:
            self.processor.handleInitialState(key, item, self.timer_values)
        self._current = _NO_KEY
        self._initial_ns += time.perf_counter_ns() - start
        self.metrics["initialStateProcessingTimeMs"] = self._initial_ns // 1_000_000

    def _call(self, group, key, items: list, spans_batches: bool = False) -> None:
        """handleInputRows once for all of a key's rows, as pyspark's worker calls it: a key
        whose rows came in two Arrow batches has them cut into DataFrames anew."""
        self._pending = None
        items = self._whole_key(items, spans_batches)
        self._current = group
        self._collect(self.processor.handleInputRows(key, iter(items), self.timer_values))
        self._current = _NO_KEY

    def _expire_timers(self) -> None:
        """handleExpiredTimer for each timer due, then the timer's deletion: pyspark's
        worker's order, after every key's rows."""
        timers = self.timers
        if timers is None:
            return
        start = time.perf_counter_ns()
        names = [f.name for f in self.key_fields[:-1]]
        for ts, group in timers.expired(self.expiry_threshold):
            key_batch, row = self._key_columns(group)
            key = self._Row(**dict(zip(names, (c[row].as_py() for c in key_batch.columns))))
            self._current = group
            self._collect(self.processor.handleExpiredTimer(
                key, self.timer_values, self._ExpiredTimerInfo(ts)))
            timers.delete(ts, group)
            self._current = _NO_KEY
        self.metrics["timerProcessingTimeMs"] += (time.perf_counter_ns() - start) // 1_000_000

    def _collect(self, result) -> None:
        if result is None:
            return
        if self.pandas:
            pd = self.io._pd
            for pdf in result:
                if not isinstance(pdf, pd.DataFrame):
                    from pyspark.errors import PySparkValueError
                    raise PySparkValueError(
                        "Invalid return type. Please make sure that the UDF returns a "
                        "pandas.DataFrame when the specified return type is StructType.")
                if len(pdf) > 0:
                    self.io.outputs.append(pdf)
        else:
            self._output_rows.extend(row.asDict(True) for row in result)

    def _write(self, state: VersionedState) -> None:
        """The variables' changed values of this batch, as puts and removes."""
        written, self.dirty = self.dirty, {}
        for var in self.variables.values():
            if var is not self.timers:
                var._written_key = _NO_KEY
        dirty = list(written)
        for column, name in enumerate(self.order):
            var = self.variables[name]
            changed = [g for n, g in dirty if n == name]
            if not changed:
                continue
            present = [g for g in changed if g in var.data]
            gone = [g for g in changed if g not in var.data]
            if gone:
                state.pop_present(self._store_keys(name, gone)[0])
            if present:
                hkeys, key_columns = self._store_keys(name, present)
                values = [var.data[g] for g in present]
                if var.kind == VALUE:
                    array = var.store_codec.to_arrow(values)
                elif var.kind == TIMERS:
                    array = pa.ListArray.from_arrays(
                        pa.array(_offsets(values), pa.int32()),
                        pa.array([t for times in values for t in times], pa.int64()))
                else:
                    flat = [v for lst in values for v in (lst if var.kind == LIST else
                                                          lst.values())]
                    items = var.store_codec.to_arrow(flat)
                    if var.kind == MAP:
                        user_keys = var.key_codec.to_arrow(
                            [k for entries in values for k in entries])
                        items = pa.StructArray.from_arrays(
                            [user_keys, items], fields=list(var.type.value_type))
                    array = pa.ListArray.from_arrays(pa.array(_offsets(values), pa.int32()),
                                                     items, type=var.type)
                value_columns = [array if i == column else pa.nulls(len(present), f.type)
                                 for i, f in enumerate(self.value_fields)]
                state.put_rows(hkeys, pa.RecordBatch.from_arrays(
                    key_columns + value_columns, schema=state.schema))
        self._write_changes(state, written)
        if self.holds_keys:
            self._hold_keys(dict.fromkeys(g for _, g in dirty))

    def _write_changes(self, state: VersionedState, written: dict) -> None:
        """This batch's state operations as change records, per variable and key in the
        order they ran; one update of a value, or one put of a list, that the key's put row
        already holds is left out (the reader derives it from the row)."""
        logged: dict = {}
        for (name, group), records in written.items():
            if not records:   # timers: no change feed
                continue
            var = self.variables[name]
            if (len(records) == 2 and records[0] == CHANGE_UPDATE and var.kind != MAP
                    and var.data.get(group) == records[1]):
                continue
            logged.setdefault(name, []).append((group, records))
        for column, name in enumerate(self.order):
            if name not in logged:
                continue
            var = self.variables[name]
            groups, owners, ops, payloads = [], [], [], []
            for i, (group, records) in enumerate(logged[name]):
                groups.append(group)
                for op, payload in _change_rows(var.kind, records):
                    owners.append(i)
                    ops.append(op)
                    payloads.append(payload)
            _, key_columns = self._store_keys(name, groups)
            rows = pa.array(owners, pa.int32())
            array = _change_column(var, payloads)
            value_columns = [array if i == column else pa.nulls(len(ops), f.type)
                             for i, f in enumerate(self.value_fields)]
            state.record_changes(pa.RecordBatch.from_arrays(
                [c.take(rows) for c in key_columns] + value_columns, schema=state.schema),
                pa.array(ops, pa.int8()))

    def _hold_keys(self, groups) -> None:
        """Keeps the key columns of keys that have state (one take for the new ones), drops
        those of keys that have none left."""
        new = []
        for g in groups:
            if any(g in var.data for var in self.variables.values()):
                if g not in self.held_keys:
                    new.append(g)
            else:
                self.held_keys.pop(g, None)
        if new:
            keys = gather_rows([self._key_rows[g] for g in new],
                               [f.name for f in self.key_fields[:-1]])
            for i, g in enumerate(new):
                self.held_keys[g] = (keys, i)

    def _key_columns(self, group) -> tuple[pa.RecordBatch, int]:
        return self._key_rows.get(group) or self.held_keys[group]

    def _store_keys(self, name: str, groups: list) -> tuple[list, list[pa.Array]]:
        """The store's keys (grouping key columns and the variable's name) of groups seen in
        this batch or holding timers: their hashable form and their columns."""
        keys = gather_rows([self._key_columns(g) for g in groups],
                           [f.name for f in self.key_fields[:-1]])
        columns = list(keys.columns) + [pa.array([name] * len(groups), pa.string())]
        return keycodec.rows(columns, len(groups)), columns

    def finish(self, state: VersionedState) -> Iterator[pa.RecordBatch]:
        self._attach(state)
        with self.updating():
            self._seed()
            if self._pending is not None:
                self._call(*self._pending)
            self._expire_timers()
            self.processor.close()
            for var in self.variables.values():   # Spark's doTtlCleanup, before the commit
                if var.ttl is not None:
                    expired = var.expire()
                    self.metrics["numRemovedStateRows"] += expired
                    self.metrics["numValuesRemovedDueToTTLExpiry"] += expired
            self._write(state)
        self._key_rows = {}
        state.objects["total"] = self.total
        self.metrics["numTotalStateRows"] = self.total
        self.close_timings()
        batch = self._output()
        if batch is not None:
            yield batch

    def _output(self) -> pa.RecordBatch | None:
        if self.pandas:
            return self.io.output_batch()
        if not self._output_rows:
            return None
        if self._output_schema is None:   # as pyspark's worker converts Rows
            self._output_schema = pa.schema(arrow_fields(self.io.output_schema, "UTC"))
        rows, self._output_rows = self._output_rows, []
        return pa.RecordBatch.from_pylist(rows, schema=self._output_schema)
