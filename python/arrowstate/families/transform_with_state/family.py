"""transformWithState (Row API) and transformWithStateInPandas, with the user's
StatefulProcessor in the worker that holds its state: every state operation is a dict
operation here, never a round trip to the JVM.

Semantics follow pyspark's worker and Spark's state variables (ValueStateImpl,
ListStateImpl, MapStateImpl):
- rows arrive sorted by grouping key; the processor is initialised once per task (its
  state variables registered), handleInputRows is called once per key with the key's rows
  (pandas: DataFrames of at most maxRecordsPerBatch rows; Row API: Rows), then close();
- a value handed to update/append/updateValue is stored as Spark stores it: see codec;
- metrics as Spark counts them: see variables.
Timers (time modes ProcessingTime and EventTime) as pyspark's worker runs them: see timers.
In EventTime mode rows at or before the late-events watermark are dropped and counted, as
Spark drops them. State variables with a TTL: see variables.Variable. An initial state
arrives before the first batch's rows (`initial_state`): handleInitialState per key.
Variables across runs (kept, deleted with deleteIfExists, their schemas evolved): see
across_runs.

State rows: see spark_state.transform_with_state. Change feed: see changelog. State on the
tier (a worker with a memory budget): see working_set.
"""
from __future__ import annotations

import base64
import time
from typing import Any, Iterator

import pyarrow as pa

from ... import keys as keycodec
from ...spark_state.layout import arrow_fields
from ...spark_state.transform_with_state import LAYOUT, STATE_NAME, TIMER_VARIABLE
from ...store.versions.versioned import VersionedState
from ..base import (WATERMARK_METRICS, FamilyBase, UnsortedInput, gather_rows, live_clock_ms,
                    sorted_by_key)
from ..pandas_io import PandasIO
from .across_runs import AcrossRuns
from .changelog import write_changes
from .codec import state_error, struct_schema
from .kinds import COUNTED_METRICS, LIST, MAP, VALUE
from .processor_input import ProcessorInput, rows_to_arrow
from .timers import Timers
from .variables import NO_KEY, Variable, column_values, plain_key_column, variable_column
from .working_set import WorkingSet


class TransformWithState(AcrossRuns, FamilyBase):
    name = "transformWithState"
    layout = LAYOUT
    named_columns = True   # a processor may add state variables between runs, as in Spark
    tiered = True          # on the tier, a key's rows are found by its grouping key (prefix)

    def __init__(self, operator: dict[str, Any], input_schema: pa.Schema):
        super().__init__(operator, WATERMARK_METRICS + ("numTotalStateRows",) + COUNTED_METRICS)
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
        self.prefix_count = len(self.key_indices)
        self.working: WorkingSet | None = None   # state on the tier: the keys loaded
        self.value_indices = operator["valueIndices"]
        self.initial_key_count = operator.get("initialKeyCount")
        self.input = ProcessorInput(operator, self.io, Row)
        self._unsorted = UnsortedInput(operator, self.key_indices, self.input.max_rows)
        self.real_time = bool(operator.get("realTime"))
        self._output_schema = None   # Row API: the Arrow schema pyspark's worker writes
        self._output_rows: list = []   # Row API: the processor's Rows
        self._attached = False
        self.key_fields = [input_schema.field(i) for i in self.key_indices] + [
            pa.field(STATE_NAME, pa.string())]
        self.variables: dict[str, Variable] = {}
        self._parsed: dict = operator["variables"]
        # Spark's Avro state encoding lets a variable's fields evolve by name
        self.fields_by_name = operator.get("stateEncoding") == "avro"
        self.total = 0
        self._plain_key = plain_key_column(self.key_fields[:-1])
        # the grouping key being processed, NO_KEY between keys (state clients read it)
        self.current_group = NO_KEY
        self._key_rows: dict = {}              # grouping key -> (key batch, row) this batch
        self._pending = None   # the batch's last key, whose rows may go on in the next one
        self._initial_pending = None   # likewise for the initial state's rows
        self._initial_ns = 0
        self.timers = None if self.time_mode == "None" else Timers(self)
        # With timers or TTLs a key's state changes in batches without its rows: the key
        # columns of every key with state are kept, key -> (key batch, row)
        self.held_keys: dict = {}
        self.deleted: list[Variable] = []   # variables init() deleted (deleteIfExists)
        self.deleted_undeclared: list[str] = []   # deleted without a declaration this run
        self.dropped: list[str] = []   # of those, the ones the files held: dropped on load
        self.initialized = False   # whether init() returned: deleteIfExists is refused after
        from .handle import LocalHandle
        self.processor.init(LocalHandle(self))
        self.initialized = True
        if self.timers is not None:
            self.variables[TIMER_VARIABLE] = self.timers
        self.order = sorted(self.variables)
        self.holds_keys = self.timers is not None or any(
            v.ttl is not None for v in self.variables.values())
        self.value_fields = [pa.field(f"s_{n}", self.variables[n].type) for n in self.order]
        self.orphans: list[str] = []   # variables the files hold and init() does not declare

    def register(self, name: str, kind: str, schema, key_schema=None,
                 ttl_ms: int | None = None) -> Variable:
        if name in self.variables:
            raise state_error(f"state variable {name} is defined twice")
        parsed = self._parsed.get(name, {})
        var = Variable(self, name, kind, struct_schema(schema, parsed.get("value")),
                       None if key_schema is None
                       else struct_schema(key_schema, parsed.get("userKey")), ttl_ms)
        self.variables[name] = var
        counted = {VALUE: "numValueState", LIST: "numListState", MAP: "numMapState"}[kind]
        self.metrics[counted + ("Vars" if ttl_ms is None else "WithTTLVars")] += 1
        return var

    def current_key(self):
        if self.current_group is NO_KEY:
            raise state_error("state is only available while a grouping key is processed "
                              "(handleInputRows)")
        return self.current_group

    # -- state between batches --------------------------------------------------------------
    def rebuild_index(self, state: VersionedState) -> None:
        """Loads the variables' values from the stored rows (after a load from files); on
        the tier, only what the family keeps between batches (see working_set)."""
        if state.prefix_dtype is not None:
            state.objects = WorkingSet(self, state).rebuild()
            return
        rows = state.live_rows()
        nk = len(self.key_fields) - 1
        groups = keycodec.rows(rows.columns[:nk], rows.num_rows)
        names = rows.column(nk).to_pylist()
        data = {n: {} for n in self.order}
        self.decode_rows(rows, groups, data)
        self.check_known(names)
        total = sum(self.variables[n].entries_of(v) for n, d in data.items() for v in d.values())
        total += self.orphan_entries(rows, names)
        key_batch = rows.select(range(nk))
        held_keys = ({g: (key_batch, i) for i, g in enumerate(groups)} if self.holds_keys
                     else {})
        state.objects = {"variables": data, "total": total, "timerHeap": [],
                         "heldKeys": held_keys, "ttlIndexes": {}}

    def check_known(self, names) -> None:
        """Fails on stored rows of variables this processor neither declares nor keeps."""
        unknown = set(names) - set(self.order) - set(self.orphans) - set(self.dropped)
        if unknown:
            raise state_error(f"the stored state holds variables {sorted(unknown)} that "
                              "the processor does not define")

    def decode_rows(self, rows: pa.RecordBatch, groups: list, data: dict | None = None) -> None:
        """Stored rows' values, decoded into `data` (name -> key -> value), by default the
        variables' own dicts; `groups`: each row's grouping key."""
        nk = len(self.key_fields) - 1
        names = rows.column(nk).to_pylist()
        for column, name in enumerate(self.order):
            var = self.variables[name]
            picked = [i for i, n in enumerate(names) if n == name]
            if not picked:
                continue
            decoded = column_values(var, rows.column(nk + 1 + column).take(pa.array(picked)))
            target = var.data if data is None else data[name]
            for i, value in zip(picked, decoded):
                target[groups[i]] = value

    def load_rows(self, rows: pa.RecordBatch, groups: list) -> None:
        """Stored rows loaded on the tier (`groups`: each row's grouping key): their values
        into the variables, and their keys' columns for timers' Rows and writes where this
        batch has not brought them."""
        self.decode_rows(rows, groups)
        key_batch = rows.select(range(len(self.key_fields) - 1))
        key_rows = self._key_rows
        for i, g in enumerate(groups):
            key_rows.setdefault(g, (key_batch, i))

    def _attach(self, state: VersionedState) -> None:
        if self._attached:
            return
        self._attached = True
        held = state.objects
        if held is None or set(held["variables"]) != set(self.order):
            self.rebuild_index(state)
            held = state.objects
        if state.prefix_dtype is not None:
            self.working = WorkingSet(self, state)
        for name, var in self.variables.items():
            if var is not self.timers:
                var.data = held["variables"][name]
            if var.ttl is not None and self.working is not None:
                var.attach_tier_index(held["ttlIndexes"][name])
            elif var.ttl is not None:
                var.attach_index(held["ttlIndexes"].setdefault(name, []))
        if self.timers is not None and self.working is not None:
            self.timers.attach_tier(held["variables"][TIMER_VARIABLE], held["timerIndex"])
        elif self.timers is not None:
            self.timers.attach(held["variables"][TIMER_VARIABLE], held["timerHeap"])
        self.held_keys = held["heldKeys"]
        self.total = held["total"]
        for var in self.deleted:
            self.drop_variable(state, var)
        if self.dropped:
            self.drop_rows(state, self.dropped)

    # -- one micro-batch --------------------------------------------------------------------
    def process(self, state: VersionedState, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        self._attach(state)
        if self._unsorted.hold(batch):
            return None
        if self.real_time:
            return self._flush(batch)
        with self.updating():
            self._seed()
            self._process(batch)
        return self._output()

    def _flush(self, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        """Real-time mode: one flush of rows, answered whole: handleInputRows once per key
        with rows in it, then the timers due (processing time against the live clock, event
        time against the batch's fixed watermark), as Spark's real-time transformWithState
        checks them after each row. State is written at the batch's end (`finish`)."""
        self._tick()
        with self.updating():
            self._seed()
            # the flush's rows are all the processor gets of them: sorted, each key is one call
            for part in sorted_by_key([batch], self.key_indices, self.input.max_rows):
                self._process(part)
            if self._pending is not None:
                self._call(*self._pending)
            self._expire_timers()
        return self._output()

    def _tick(self) -> None:
        """Real-time mode, ProcessingTime: the processor's clock, timers' and TTL's, is the
        live one at each flush."""
        if not (self.real_time and self.time_mode == "ProcessingTime"):
            return
        from pyspark.sql.streaming.stateful_processor import TimerValues
        now = live_clock_ms()
        self.timer_values = TimerValues(now, self.timer_values.getCurrentWatermarkInMs())
        self.expiry_threshold = now
        for var in self.variables.values():
            var.now = now

    def _groups(self, batch: pa.RecordBatch, key_indices: list[int]) -> list | None:
        """The batch's grouping keys as the dicts hold them on the tier (their stored rows
        loaded); None for state in memory (the input's own form)."""
        if self.working is None:
            return None
        groups = self.working.groups([batch.column(i) for i in key_indices], batch.num_rows)
        self.working.load(groups)
        return groups

    def _process(self, batch: pa.RecordBatch) -> None:
        if self.late_threshold is not None and self.event_time_index >= 0:
            late = self.late_mask(*keycodec.event_time_micros(
                batch.column(self.event_time_index)))
            if late.any():   # EventTime mode: Spark drops rows the watermark has passed
                batch = batch.filter(pa.array(~late))
        # each key is called once the next one shows its rows are all here; the batch's
        # last key waits (pending): its rows may go on in the next batch
        key_rows, previous = self._key_rows, None
        handle, timer_values = self.processor.handleInputRows, self.timer_values
        collect = self._collect if self.pandas else self._output_rows.extend
        for entry in self.input.keys_of(batch, self.key_indices, self.value_indices,
                                        self._groups(batch, self.key_indices)):
            group = entry[0]
            if previous is not None:   # inline: this runs per key
                self.current_group = previous[0]
                result = handle(previous[2], iter(previous[3]), timer_values)
                if result is not None:
                    collect(result)
            elif self._pending is not None:
                pending = self._pending
                if pending[0] == group:
                    pending[2].extend(entry[3])   # the key's rows go on from the last batch
                    pending[3] = True
                    continue
                self._call(*pending)
            key_rows[group] = entry[1]
            previous = entry
        self.current_group = NO_KEY
        if previous is not None:
            self._pending = [previous[0], previous[2], previous[3], False]

    def initial_state(self, state: VersionedState, batch: pa.RecordBatch) -> None:
        """A batch of the initial state (the query's first batch, before any input rows):
        handleInitialState per key, per DataFrame (pandas) or per Row; a key whose rows go
        on in the next batch is called once they have all come, as for input rows."""
        self._attach(state)
        before, start = self._initial_ns, time.perf_counter_ns()
        k = self.initial_key_count
        with self.updating():
            for group, key_columns, key, items in self.input.keys_of(
                    batch, list(range(k)), list(range(k, batch.num_columns)),
                    self._groups(batch, list(range(k)))):
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
        items = self.input.whole_key(items, spans_batches)
        self.current_group = group
        for item in items:
            self.processor.handleInitialState(key, item, self.timer_values)
        self.current_group = NO_KEY
        self._initial_ns += time.perf_counter_ns() - start
        self.metrics["initialStateProcessingTimeMs"] = self._initial_ns // 1_000_000

    def _call(self, group, key, items: list, spans_batches: bool = False) -> None:
        """handleInputRows once for all of a key's rows, as pyspark's worker calls it: a key
        whose rows came in two Arrow batches has them cut into DataFrames anew."""
        self._pending = None
        items = self.input.whole_key(items, spans_batches)
        self.current_group = group
        self._collect(self.processor.handleInputRows(key, iter(items), self.timer_values))
        self.current_group = NO_KEY

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
            self.current_group = group
            self._collect(self.processor.handleExpiredTimer(
                key, self.timer_values, self._ExpiredTimerInfo(ts)))
            timers.delete(ts, group)
            self.current_group = NO_KEY
        self.metrics["timerProcessingTimeMs"] += (time.perf_counter_ns() - start) // 1_000_000

    def _collect(self, result) -> None:
        if result is None:
            return
        if self.pandas:
            pd = self.io.pd
            for pdf in result:
                if not isinstance(pdf, pd.DataFrame):
                    from pyspark.errors import PySparkValueError
                    raise PySparkValueError(
                        "Invalid return type. Please make sure that the UDF returns a "
                        "pandas.DataFrame when the specified return type is StructType.")
                if len(pdf) > 0:
                    self.io.outputs.append(pdf)
        else:
            self._output_rows.extend(result)

    def _write(self, state: VersionedState) -> None:
        """The variables' changed values of this batch, as puts and removes."""
        written = {}   # variable -> grouping key -> its operations (Variable.dirty)
        for name, var in self.variables.items():
            changes = var.take_changes()
            if changes:
                written[name] = changes
        put = {}   # variable -> the keys put and their column (see write_changes)
        for column, name in enumerate(self.order):
            changed = written.get(name)
            if not changed:
                continue
            data = self.variables[name].data
            present = [g for g in changed if g in data]
            gone = [] if len(present) == len(changed) else [g for g in changed if g not in data]
            if gone:
                columns = self.store_columns(name, gone)
                state.pop_present(state.keys(columns, len(gone)))
            if present:
                key_columns = self.store_columns(name, present)
                hkeys = state.keys(key_columns, len(present))
                array = variable_column(self.variables[name], [data[g] for g in present])
                state.put_rows(hkeys, pa.RecordBatch.from_arrays(
                    key_columns + self.value_columns(column, array), schema=state.schema))
                put[name] = (present, array)
        write_changes(self, state, written, put)
        if self.holds_keys and self.working is None:
            self._hold_keys(dict.fromkeys(g for changed in written.values() for g in changed))

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

    def value_columns(self, column: int, array: pa.Array) -> list[pa.Array]:
        """The store's value columns of rows of one variable: `array` in its column, the
        other variables' columns null."""
        return [array if i == column else pa.nulls(len(array), f.type)
                for i, f in enumerate(self.value_fields)]

    def store_columns(self, name: str, groups: list) -> list[pa.Array]:
        """The store's key columns (grouping key columns and the variable's name) of groups
        seen in this batch or holding timers."""
        if self._plain_key is not None and self.working is None:
            keys = [self._plain_key(groups)]
        else:
            keys = gather_rows([self._key_columns(g) for g in groups],
                               [f.name for f in self.key_fields[:-1]]).columns
        return list(keys) + [pa.array([name] * len(groups), pa.string())]

    def finish(self, state: VersionedState) -> Iterator[pa.RecordBatch]:
        self._attach(state)
        self._tick()
        outputs = []
        with self.updating():
            self._seed()
            for batch in self._unsorted.sorted():
                self._process(batch)
                outputs.append(self._output())
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
            if self.working is not None:   # the tier holds the values now
                if self.timers is not None:
                    self.timers.flush()
                for var in self.variables.values():
                    if var.ttl is not None:
                        var.flush()
                self.working.drop()
        self._key_rows = {}
        state.objects["total"] = self.total
        self.metrics["numTotalStateRows"] = self.total
        self.close_timings()
        outputs.append(self._output())
        yield from (batch for batch in outputs if batch is not None)

    def _output(self) -> pa.RecordBatch | None:
        if self.pandas:
            return self.io.output_batch()
        if not self._output_rows:
            return None
        if self._output_schema is None:   # as pyspark's worker converts Rows
            self._output_schema = pa.schema(arrow_fields(self.io.output_schema, "UTC"))
        rows, self._output_rows = self._output_rows, []
        return rows_to_arrow(rows, self._output_schema)

