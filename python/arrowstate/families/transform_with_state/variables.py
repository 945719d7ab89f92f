"""transformWithState's state variables, as Spark's state variables (ValueStateImpl,
ListStateImpl, MapStateImpl), whose clients (clients.py) pyspark's ValueState, ListState and
MapState call:
- metrics as Spark counts them: an update, an appended value, a map entry written count as
  updated rows; a cleared value one removed row, a cleared list its values, a removed map
  entry one; numRowsTotal counts values, non-empty lists and map entries.
State variables with a TTL: see Variable.
"""
from __future__ import annotations

import heapq
import itertools

import pyarrow as pa

from ...store.formats.files import CHANGE_DELETE, CHANGE_UPDATE
from .codec import Codec, TtlCodec, list_offsets
from .context import NO_KEY, OperationContext
from .kinds import LIST, MAP, TIMERS, VALUE

SEQUENCE = itertools.count()   # heap entries' tie-break: unique, so keys are never compared


class Variable:
    """One state variable: its kind, schemas, Arrow column and in-memory elements (grouping
    key -> element | list of elements | dict of user key -> element), an element being the
    value tuple, or (value tuple, expiry ms) with a TTL.

    With a TTL (Spark's ValueStateImplWithTTL, ListStateImplWithTTL, MapStateImplWithTTL)
    an element expires at the batch timestamp of its last write plus the TTL: from a batch
    whose timestamp reaches that, reads skip it, and at the end of the batch it is removed
    (counted as removed rows and in numValuesRemovedDueToTTLExpiry). A heap of (expiry,
    sequence, element key) finds what expires without a scan of the state; on the tier an
    index of grouping keys does (working_set.KeyTimeIndex).

    `context`: the key being processed and the counts its operations keep; `timezone`:
    the session's, for timestamps; `now`: the batch's processing time (ms)."""

    def __init__(self, context: OperationContext, name: str, kind: str, schema,
                 key_schema=None, ttl_ms: int | None = None, *, timezone: str,
                 now: int) -> None:
        self.context, self.name, self.kind, self.ttl = context, name, kind, ttl_ms
        self.codec = Codec(schema, timezone)
        self.store_codec = self.codec if ttl_ms is None else TtlCodec(self.codec)
        self.key_codec = None if key_schema is None else Codec(key_schema, timezone)
        if kind == VALUE:
            self.type = self.store_codec.type
        elif kind == LIST:
            self.type = pa.list_(self.store_codec.type)
        else:
            self.type = pa.list_(pa.struct([pa.field("key", self.key_codec.type),
                                            pa.field("value", self.store_codec.type)]))
        self.data: dict = {}
        self.clients: list = []   # the processor's handles on it (deleteIfExists swaps them)
        self.now = now
        self.expiry = None if ttl_ms is None else self.now + ttl_ms
        self.index: list = []     # TTL: heap of (expiry, sequence, element key)
        self.tier = None          # TTL on the tier: KeyTimeIndex of (expiry, grouping key)
        self._indexed = 0         # TTL: heap size after its last rebuild
        # the last key `changes` gave this batch, and its operations: clients write to them
        # inline (a processor works on one key at a time)
        self.last_changed_key, self.last_changes = NO_KEY, None
        # grouping key -> its state operations this batch (logged), in the order keys were
        # first written
        self.dirty: dict = {}

    # -- what the processor calls, for the current grouping key -----------------------------
    def current_key(self):
        """The grouping key being processed (fails between keys)."""
        key = self.context.group
        return self.context.key() if key is NO_KEY else key

    def changes(self, key) -> list:
        """Marks the key's value as written in this batch; its operations (see logged).
        The last key's are at hand (`last_changes`)."""
        if key is self.last_changed_key:
            return self.last_changes
        records = self.dirty.get(key)
        if records is None:
            records = self.dirty[key] = []
        self.last_changed_key, self.last_changes = key, records
        return records

    def take_changes(self) -> dict:
        """This batch's operations (`dirty`), handed over at its end: the next batch starts
        with none."""
        dirty, self.dirty = self.dirty, {}
        self.last_changed_key = NO_KEY
        return dirty

    def logged(self, key, op: int, payload=None) -> None:
        """Notes a state operation for the change feed, as an op and its payload: an
        element or None (value: update, delete), a list of elements (list: put), an element
        (list: append), None (list: delete). Flat, two items an operation (a map's three:
        see logged_entry), so that a write costs no container of its own."""
        records = self.changes(key)
        records.append(op)
        records.append(payload)

    def logged_entry(self, key, op: int, user_key, element=None) -> None:
        """Notes a map operation: an entry written, or removed (no element)."""
        records = self.changes(key)
        records.append(op)
        records.append(user_key)
        records.append(element)

    def entries(self, key) -> int:
        """Rows Spark counts for the key: a value, a list, each map entry."""
        return self.entries_of(self.data.get(key))

    def entries_of(self, value) -> int:
        return 0 if value is None else (len(value) if self.kind == MAP else 1)

    def set(self, key, value) -> None:
        """Sets the key's element (None, or an empty list or map, removes it), keeping
        the count of state rows and marking the key changed."""
        before = self.entries(key)
        if value is None or (self.kind != VALUE and not value):
            self.data.pop(key, None)
        else:
            self.data[key] = value
        self.context.total += self.entries(key) - before
        self.changes(key)

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
        if self.tier is not None:
            self.tier.pending.append((self.expiry, element_key[0] if self.kind == MAP
                                      else element_key))
            return
        heapq.heappush(self.index, (self.expiry, next(SEQUENCE), element_key))

    def attach_tier(self, tier) -> None:
        """On the tier: the index of every key's TTL elements (working_set.KeyTimeIndex)."""
        self.tier = tier

    def attach_index(self, index: list) -> None:
        self.index = index
        if not index and self.data:
            self._rebuild_index()

    def _rebuild_index(self) -> None:
        if self.kind == MAP:
            entries = [(e[1], next(SEQUENCE), (g, k)) for g, m in self.data.items()
                       for k, e in m.items()]
        else:
            entries = [(e[1] if self.kind == VALUE else min(x[1] for x in e), next(SEQUENCE),
                        g) for g, e in self.data.items()]
        self.index[:] = entries
        heapq.heapify(self.index)
        self._indexed = len(entries)

    def expire(self) -> int:
        """Removes the elements whose TTL has passed; how many (Spark's count)."""
        if self.tier is not None:
            return self._expire_tiered()
        index, now, data, removed = self.index, self.now, self.data, 0
        while index and index[0][0] <= now:
            _, _, element_key = heapq.heappop(index)
            if self.kind == MAP:
                group, user_key = element_key
                entries = data.get(group)
                if entries is not None and user_key in entries and entries[user_key][1] <= now:
                    remove_entry(self, group, entries, user_key)
                    self.logged_entry(group, CHANGE_DELETE, user_key)
                    removed += 1
            elif self.kind == LIST:
                values = data.get(element_key)
                if values:
                    removed += self._expire_list(element_key, values)
            else:
                element = data.get(element_key)
                if element is not None and element[1] <= now:
                    self.set(element_key, None)
                    self.logged(element_key, CHANGE_DELETE)
                    removed += 1
        if len(index) > 2 * self._indexed + 1024:   # mostly superseded entries
            self._rebuild_index()
        return removed

    def _expire_tiered(self) -> int:
        """expire() on the tier: each key that comes due is loaded and all its elements
        past their TTL go (each element has an entry at its own expiry)."""
        now, data, removed = self.now, self.data, 0
        _, groups = self.tier.due(now)
        for group in dict.fromkeys(groups):
            value = data.get(group)
            if value is None:
                continue
            if self.kind == MAP:
                for user_key, element in list(value.items()):
                    if element[1] <= now:
                        remove_entry(self, group, value, user_key)
                        self.logged_entry(group, CHANGE_DELETE, user_key)
                        removed += 1
            elif self.kind == LIST:
                removed += self._expire_list(group, value)
            elif value[1] <= now:
                self.set(group, None)
                self.logged(group, CHANGE_DELETE)
                removed += 1
        return removed

    def _expire_list(self, group, values: list) -> int:
        """Removes a list's elements past their TTL; how many."""
        kept = [e for e in values if e[1] > self.now]
        if len(kept) == len(values):
            return 0
        self.set(group, kept)
        # Spark's cleanup removes the list, then puts what is left
        self.logged(group, CHANGE_DELETE)
        if kept:
            self.logged(group, CHANGE_UPDATE, list(kept))
        return len(values) - len(kept)


def column_values(var, column: pa.Array) -> list:
    """A variable's rows' values (its column, its rows only) as the variable holds them: a
    value tuple, a list of them, a dict of user key to value, or a key's timer times."""
    if var.kind == VALUE:
        return var.store_codec.from_arrow(column)
    if var.kind == TIMERS:
        return column.to_pylist()
    flat = var.store_codec.from_arrow(column.flatten() if var.kind == LIST
                                      else column.flatten().field("value"))
    keys = var.key_codec.from_arrow(column.flatten().field("key")) if var.kind == MAP else None
    offsets = column.offsets.to_pylist()
    return [flat[a:b] if keys is None else dict(zip(keys[a:b], flat[a:b]))
            for a, b in zip(offsets[:-1], offsets[1:])]


def variable_column(var, values: list) -> pa.Array:
    """The column of a variable's values (column_values' inverse)."""
    if var.kind == VALUE:
        return var.store_codec.stored_to_arrow(values)
    offsets = pa.array(list_offsets(values), pa.int32())
    if var.kind == TIMERS:
        return pa.ListArray.from_arrays(offsets, pa.array(
            [t for times in values for t in times], pa.int64()))
    chain = itertools.chain.from_iterable
    items = var.store_codec.stored_to_arrow(
        list(chain(values) if var.kind == LIST else chain(map(dict.values, values))))
    if var.kind == MAP:
        user_keys = var.key_codec.stored_to_arrow(list(chain(values)))
        items = pa.StructArray.from_arrays([user_keys, items],
                                           fields=list(var.type.value_type))
    return pa.ListArray.from_arrays(offsets, items, type=var.type)


def remove_entry(var: Variable, group, entries: dict, user_key) -> None:
    if len(entries) == 1:
        var.set(group, None)
    else:
        del entries[user_key]
        var.context.total -= 1
        var.changes(group)
