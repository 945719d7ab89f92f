"""What the processor holds: pyspark's StatefulProcessorHandle, ValueState, ListState and
MapState over the state variables and timers held here; the handle keeps what init()
declares through it (the variables, the timers, the deletions). pyspark's classes are their
bases, so this module imports pyspark.sql.streaming; the family imports it when one is
first made (as it imports pyspark's other classes), not when it is imported.
"""
from __future__ import annotations

from typing import Iterator

from pyspark.sql.streaming.stateful_processor import (ListState, MapState,
                                                      StatefulProcessorHandle, ValueState)

from ...spark_state.transform_with_state import TIMER_VARIABLE
from .clients import ListClient, MapClient, ValueClient
from .codec import state_error, struct_schema
from .context import OperationContext
from .kinds import LIST, MAP, VALUE
from .timers import Timers
from .variables import Variable


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


def _ttl_ms(time_mode: str, name: str, ttl) -> int | None:
    """As Spark reads a TTLConfig: none or zero is no TTL; a TTL needs ProcessingTime."""
    if not ttl:
        return None
    if time_mode != "ProcessingTime":
        raise state_error(f"state variable {name}: a TTL needs time mode ProcessingTime "
                          f"(Spark: cannotProvideTTLConfigForTimeMode), not {time_mode}")
    if ttl < 0:
        raise state_error(f"state variable {name}: the TTL must be positive, not {ttl}")
    return int(ttl)


class LocalHandle(StatefulProcessorHandle):
    """The processor's StatefulProcessorHandle, with state variables held here. No API
    client (pyspark's handle needs one): the handle makes the variables itself, over the
    task's `context`, with the schemas the JVM parsed (`parsed`: name -> value and user
    key schemas), in the session's `timezone`, written at processing time `now` (ms).
    After init(), `variables` (timers' included), `timers`, `deleted` (declared variables
    deleteIfExists removed) and `deleted_undeclared` (names it removed that init() did not
    declare) are what it declared."""

    def __init__(self, context: OperationContext, parsed: dict, time_mode: str,
                 timezone: str, now: int) -> None:
        self._context, self._parsed, self._time_mode = context, parsed, time_mode
        self._timezone, self._now = timezone, now
        self.variables: dict[str, Variable | Timers] = {}
        self.timers = None if time_mode == "None" else Timers(context)
        self.deleted: list[Variable] = []
        self.deleted_undeclared: list[str] = []
        self._open = True   # init() running: deleteIfExists is refused after it

    def close(self) -> None:
        """init() returned: the declarations are complete (the timers are one more)."""
        self._open = False
        if self.timers is not None:
            self.variables[TIMER_VARIABLE] = self.timers

    def _declared(self, name: str, kind: str, schema, key_schema, ttl) -> Variable:
        ttl_ms = _ttl_ms(self._time_mode, name, ttl)
        if name in self.variables:
            raise state_error(f"state variable {name} is defined twice")
        parsed = self._parsed.get(name, {})
        var = Variable(self._context, name, kind, struct_schema(schema, parsed.get("value")),
                       None if key_schema is None
                       else struct_schema(key_schema, parsed.get("userKey")), ttl_ms,
                       timezone=self._timezone, now=self._now)
        self.variables[name] = var
        counted = {VALUE: "numValueState", LIST: "numListState", MAP: "numMapState"}[kind]
        self._context.metrics[counted + ("Vars" if ttl_ms is None else "WithTTLVars")] += 1
        return var

    def _timers(self) -> Timers:
        if self.timers is None:
            raise state_error("timers need time mode ProcessingTime or EventTime (Spark: "
                              "STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_TIME_"
                              "MODE); this query runs with time mode None")
        return self.timers

    def getValueState(self, stateName, schema, ttlDurationMs=None):
        return _value_state(self._declared(stateName, VALUE, schema, None, ttlDurationMs))

    def getListState(self, stateName, schema, ttlDurationMs=None):
        return _list_state(self._declared(stateName, LIST, schema, None, ttlDurationMs))

    def getMapState(self, stateName, userKeySchema, valueSchema, ttlDurationMs=None):
        return _map_state(self._declared(stateName, MAP, valueSchema, userKeySchema,
                                         ttlDurationMs))

    def registerTimer(self, expiryTimestampMs: int) -> None:
        self._timers().register(int(expiryTimestampMs))

    def deleteTimer(self, expiryTimestampMs: int) -> None:
        self._timers().delete(int(expiryTimestampMs))

    def listTimers(self) -> Iterator[int]:
        return self._timers().list()

    def deleteIfExists(self, stateName):
        """The variable's state goes at the batch's start, and any later use of it fails.
        Spark counts a deleted variable when its column family exists, which a getXState
        call earlier in init() creates; one init() did not declare goes if the files hold
        it (across_runs)."""
        if not self._open:
            raise state_error(f"deleteIfExists({stateName!r}) can only be called in init() "
                              "(Spark: STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_"
                              "INVALID_HANDLE_STATE)")
        var = self.variables.get(stateName)
        if var is None:
            self.deleted_undeclared.append(stateName)
            return
        self.deleted.append(var)
        self._context.metrics["numDeletedStateVars"] += 1
