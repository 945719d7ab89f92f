"""The clients of transformWithState's state variables: what pyspark's ValueState,
ListState and MapState call for the current grouping key (as Spark's ValueStateImpl,
ListStateImpl and MapStateImpl run them), and what they become when deleteIfExists removes
their variable.
"""
from __future__ import annotations

import itertools
from typing import Iterator

from ...store.formats.files import CHANGE_APPEND, CHANGE_DELETE, CHANGE_UPDATE
from .codec import state_error
from .context import NO_KEY
from .variables import Variable, remove_entry


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


class _Client:
    """A client of one variable, which pyspark's state object (`bind`) calls."""

    def __init__(self, var: Variable) -> None:
        self.var = var
        self._bound: tuple | None = None
        var.clients.append(self)

    def bind(self, state, methods: dict[str, str]) -> None:
        """Makes `methods` of pyspark's state object (its name -> this client's) instance
        attributes that are this client's bound methods: one Python call a state operation
        rather than two (pyspark's method, then the client's with the variable's name).
        Bound again when the client's class changes (deleteIfExists)."""
        self._bound = (state, methods)
        for public, own in methods.items():
            setattr(state, public, getattr(self, own))

    def rebind(self) -> None:
        if self._bound is not None:
            self.bind(*self._bound)


class ValueClient(_Client):

    def exists(self) -> bool:
        var = self.var
        key = var.context.group
        value = var.data.get(var.current_key() if key is NO_KEY else key)
        return (value if var.ttl is None else var.visible(value)) is not None

    def get(self):
        var = self.var
        key = var.context.group
        value = var.data.get(var.current_key() if key is NO_KEY else key)
        return value if var.ttl is None else var.visible(value)

    def update(self, value) -> None:
        var = self.var
        key = var.context.group
        if key is NO_KEY:
            key = var.current_key()
        stored = var.codec.stored(value)
        context = var.context
        if var.ttl is None:   # the common case, inline: a dict write and its bookkeeping
            data = var.data
            if key not in data:
                context.total += 1
            data[key] = stored
            context.metrics["numUpdatedStateRows"] += 1
            records = var.last_changes if key is var.last_changed_key else var.changes(key)
            records.append(CHANGE_UPDATE)
            records.append(stored)
            return
        element = var.element(stored)
        if var.data.get(key) == element:   # with a TTL Spark writes (and counts) a change
            return
        var.context.metrics["numUpdatedStateRows"] += 1
        var.indexed(key)
        var.logged(key, CHANGE_UPDATE, element)
        var.set(key, element)

    def clear(self) -> None:
        var = self.var
        key = var.current_key()
        if var.ttl is None or key in var.data:   # with a TTL Spark counts what was there
            var.context.metrics["numRemovedStateRows"] += 1
        var.set(key, None)
        var.logged(key, CHANGE_DELETE)


class ListClient(_Client):

    def exists(self) -> bool:
        var = self.var
        if var.ttl is None:
            return var.current_key() in var.data
        return any(e[1] > var.now for e in var.data.get(var.current_key(), ()))

    def values(self) -> Iterator[tuple]:
        var = self.var
        elements = var.data.get(var.current_key(), ())
        if var.ttl is None:
            return iter(list(elements))
        return iter([v for v, expiry in elements if expiry > var.now])

    def _checked(self, values) -> list:
        if values is None:
            raise state_error(f"the list state {self.var.name} cannot be set to null")
        values = list(values)
        if not values:
            raise state_error(f"the list state {self.var.name} cannot be set to an empty "
                              "list (clear() removes it)")
        var, stored = self.var, self.var.codec.stored
        if var.ttl is None:
            return [stored(v) for v in values]
        return [var.element(stored(v)) for v in values]

    def put(self, values) -> None:
        var, stored = self.var, self._checked(values)
        key = var.current_key()
        var.set(key, stored)
        var.logged(key, CHANGE_UPDATE, list(stored))
        if var.ttl is None:
            # Spark's ListStateImpl.put resets the task's updated-rows count, then counts
            var.context.metrics["numUpdatedStateRows"] = len(stored)
        else:
            var.context.metrics["numUpdatedStateRows"] += len(stored)
            var.indexed(key)

    def append_value(self, value) -> None:
        var = self.var
        element = var.codec.stored(value)
        if var.ttl is not None:
            element = var.element(element)
            var.indexed(var.current_key())
        key = var.current_key()
        current = var.data.get(key)
        if current is None:
            var.set(key, [element])
        else:
            current.append(element)
        records = var.last_changes if key is var.last_changed_key else var.changes(key)
        records.append(CHANGE_APPEND)   # logged, inline: this runs per row
        records.append(element)
        var.context.metrics["numUpdatedStateRows"] += 1

    def append_list(self, values) -> None:
        var, stored = self.var, self._checked(values)
        key = var.current_key()
        current = var.data.get(key)
        if current is None:
            var.set(key, stored)
        else:
            current.extend(stored)
        var.changes(key).extend(itertools.chain.from_iterable(
            (CHANGE_APPEND, element) for element in stored))
        var.context.metrics["numUpdatedStateRows"] += len(stored)
        if var.ttl is not None:
            var.indexed(key)

    def clear(self) -> None:
        var = self.var
        key = var.current_key()
        removed = len(var.data.get(key, ()))
        var.set(key, None)
        var.logged(key, CHANGE_DELETE)
        var.context.metrics["numRemovedStateRows"] += removed


class MapClient(_Client):

    def _map(self) -> dict:
        var = self.var
        entries = var.data.get(var.current_key(), {})
        if var.ttl is None:
            return entries
        return {k: v for k, (v, expiry) in entries.items() if expiry > var.now}

    def exists(self) -> bool:
        return bool(self._map())

    def get_value(self, key):
        var = self.var
        if var.ttl is None:   # the common case, inline: two dict reads
            group = var.context.group
            entries = var.data.get(var.current_key() if group is NO_KEY else group)
            return None if entries is None else entries.get(var.key_codec.stored(key))
        return self._map().get(var.key_codec.stored(key))

    def contains_key(self, key) -> bool:
        return self.var.key_codec.stored(key) in self._map()

    def update_value(self, key, value) -> None:
        var = self.var
        user_key, element = var.key_codec.stored(key), var.codec.stored(value)
        context = var.context
        group = context.group
        if group is NO_KEY:
            context.key()   # fails: no grouping key
        entries = var.data.get(group)
        if var.ttl is not None:
            element = var.element(element)
            if entries is not None and entries.get(user_key) == element:
                return   # with a TTL Spark writes (and counts) a change only
            var.indexed((group, user_key))
        context.metrics["numUpdatedStateRows"] += 1
        records = var.last_changes if group is var.last_changed_key else var.changes(group)
        records.append(CHANGE_UPDATE)   # logged_entry, inline: this runs per row
        records.append(user_key)
        records.append(element)
        if entries is None:
            var.set(group, {user_key: element})
        else:
            if user_key not in entries:
                context.total += 1
            entries[user_key] = element

    def remove_key(self, key) -> None:
        var = self.var
        user_key, group = var.key_codec.stored(key), var.current_key()
        entries = var.data.get(group)
        if entries is not None and user_key in entries:
            remove_entry(var, group, entries, user_key)
        # Spark records it, present or not
        var.logged_entry(group, CHANGE_DELETE, user_key)
        var.context.metrics["numRemovedStateRows"] += 1

    def clear(self) -> None:
        var = self.var
        group = var.current_key()
        entries = var.data.get(group, {})
        for k in entries:
            var.logged_entry(group, CHANGE_DELETE, k)
        var.set(group, None)
        var.context.metrics["numRemovedStateRows"] += len(entries)

    def items(self) -> list:
        return list(self._map().items())


# pyspark's client errors, by operation
DELETED_CLIENTS = {
    ValueClient: _deleted_client(ValueClient, {
        "exists": "checking value state exists", "get": "getting value state",
        "update": "updating value state", "clear": "clearing value state"}),
    ListClient: _deleted_client(ListClient, {
        "exists": "checking value state exists", "values": "getting list state",
        "put": "updating value state", "append_value": "updating value state",
        "append_list": "updating value state",
        "clear": "clearing value state"}),
    MapClient: _deleted_client(MapClient, {
        "exists": "checking map state exists", "get_value": "getting value",
        "contains_key": "checking if map state contains key",
        "update_value": "updating map state value",
        "remove_key": "removing key from map state", "clear": "clearing map state",
        "items": "getting map state iterator"}),
}
