"""What the processor holds: pyspark's StatefulProcessorHandle, ValueState, ListState and
MapState over the state variables and timers held here. pyspark's classes are their
bases, so this module imports pyspark.sql.streaming; the family imports it when one is
first made (as it imports pyspark's other classes), not when it is imported.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from pyspark.sql.streaming.stateful_processor import (ListState, MapState,
                                                      StatefulProcessorHandle, ValueState)

from .codec import state_error
from .kinds import LIST, MAP, VALUE
from .timers import Timers
from .clients import ListClient, MapClient, ValueClient
from .variables import Variable

if TYPE_CHECKING:
    from .family import TransformWithState


class LocalMapState(MapState):
    """pyspark's MapState, whose iterators here are over the current key's entries."""

    def iterator(self):
        return iter(self._mapStateClient.items())

    def keys(self):
        return iter([k for k, _ in self._mapStateClient.items()])

    def values(self):
        return iter([v for _, v in self._mapStateClient.items()])


class LocalListState(ListState):
    """pyspark's ListState, whose iterator is over the current key's values."""

    def get(self):
        return self._listStateClient.values()


def _bound(state_class: type, client, name: str, methods: dict[str, str]):
    """pyspark's state object over `client`, its operations calling the client at once."""
    state = state_class(client, name)
    client.bind(state, methods)
    return state


def _value_state(var: Variable) -> ValueState:
    return _bound(ValueState, ValueClient(var), var.name,
                  {"exists": "exists", "get": "get", "update": "update", "clear": "clear"})


def _map_state(var: Variable) -> LocalMapState:
    return _bound(LocalMapState, MapClient(var), var.name,
                  {"exists": "exists", "getValue": "get_value", "containsKey": "contains_key",
                   "updateValue": "update_value", "removeKey": "remove_key",
                   "clear": "clear"})


def _list_state(var: Variable) -> LocalListState:
    return _bound(LocalListState, ListClient(var), var.name,
                  {"exists": "exists", "put": "put", "appendValue": "append_value",
                   "appendList": "append_list", "clear": "clear"})


def _ttl_ms(family: "TransformWithState", name: str, ttl) -> int | None:
    """As Spark reads a TTLConfig: none or zero is no TTL; a TTL needs ProcessingTime."""
    if not ttl:
        return None
    if family.time_mode != "ProcessingTime":
        raise state_error(f"state variable {name}: a TTL needs time mode ProcessingTime "
                          f"(Spark: cannotProvideTTLConfigForTimeMode), not "
                          f"{family.time_mode}")
    if ttl < 0:
        raise state_error(f"state variable {name}: the TTL must be positive, not {ttl}")
    return int(ttl)


def _timers(family: "TransformWithState") -> Timers:
    if family.timers is None:
        raise state_error("timers need time mode ProcessingTime or EventTime (Spark: "
                          "STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_TIME_"
                          "MODE); this query runs with time mode None")
    return family.timers


class LocalHandle(StatefulProcessorHandle):
    """The processor's StatefulProcessorHandle, with state variables held here."""

    def __init__(self, family: "TransformWithState") -> None:
        """No API client: the family holds the state (pyspark's handle needs one)."""
        self._family = family

    def getValueState(self, stateName, schema, ttlDurationMs=None):
        family = self._family
        return _value_state(family.register(stateName, VALUE, schema,
                                            ttl_ms=_ttl_ms(family, stateName, ttlDurationMs)))

    def getListState(self, stateName, schema, ttlDurationMs=None):
        family = self._family
        return _list_state(family.register(stateName, LIST, schema,
                                           ttl_ms=_ttl_ms(family, stateName, ttlDurationMs)))

    def getMapState(self, stateName, userKeySchema, valueSchema, ttlDurationMs=None):
        family = self._family
        return _map_state(family.register(stateName, MAP, valueSchema, userKeySchema,
                                          ttl_ms=_ttl_ms(family, stateName, ttlDurationMs)))

    def registerTimer(self, expiryTimestampMs: int) -> None:
        _timers(self._family).register(int(expiryTimestampMs))

    def deleteTimer(self, expiryTimestampMs: int) -> None:
        _timers(self._family).delete(int(expiryTimestampMs))

    def listTimers(self) -> Iterator[int]:
        return _timers(self._family).list()

    def deleteIfExists(self, stateName):
        self._family.delete_variable(stateName)
