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

The family drives a task: it sets the key being processed (context) around each call of
the processor, which gets each key's rows from processor_input and whose results go to
processor_output; at the batch's end writes puts the changed values in the state rows
(their columns: schema; their key columns: key_columns; Spark's layout of them:
spark_state.transform_with_state) with their change feed (changelog). State on the tier (a
worker with a memory budget): see working_set.
"""
from __future__ import annotations

import base64
import time
from typing import Any, Iterator

import pyarrow as pa

from ... import keys as keycodec
from ...spark_state.transform_with_state import LAYOUT, STATE_NAME, TIMER_VARIABLE
from ...store.versions.versioned import VersionedState
from ..base import WATERMARK_METRICS, FamilyBase, UnsortedInput, grouped_by_key, live_clock_ms
from ..pandas_io import PandasIO
from .across_runs import AcrossRuns
from .context import NO_KEY, OperationContext
from .key_columns import KeyColumns
from .kinds import COUNTED_METRICS
from .processor_input import INITIAL, ProcessorInput
from .processor_output import ProcessorOutput
from .schema import StateSchema
from .working_set import WorkingSet, tier_objects
from .writes import write_batch


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

        from .handle import LocalHandle

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
        io = PandasIO(operator)
        udf, _ = CloudPickleSerializer().loads(base64.b64decode(operator["command"]))
        self.processor = udf.__self__._stateful_processor
        self.pandas = operator["pandas"]
        self.key_indices = operator["keyIndices"]
        self.prefix_count = len(self.key_indices)
        self.value_indices = operator["valueIndices"]
        self.initial_key_count = operator.get("initialKeyCount")
        self.input = ProcessorInput(operator, io, Row)
        self.output = ProcessorOutput(io, self.pandas)
        self._unsorted = UnsortedInput(operator, self.key_indices, self.input.max_rows)
        self.real_time = bool(operator.get("realTime"))
        self._attached = False
        self._initial_ns = 0
        # Spark's Avro state encoding lets a variable's fields evolve by name
        self.fields_by_name = operator.get("stateEncoding") == "avro"
        self.context = OperationContext(self.metrics)
        handle = LocalHandle(self.context, operator["variables"], self.time_mode, io.timezone,
                             self.timer_values.getCurrentProcessingTimeInMs())
        self.processor.init(handle)
        handle.close()
        self.variables, self.timers = handle.variables, handle.timers
        self.deleted = handle.deleted   # variables init() deleted (deleteIfExists)
        self.deleted_undeclared = handle.deleted_undeclared   # deleted without a declaration
        self.schema = StateSchema([input_schema.field(i) for i in self.key_indices]
                                  + [pa.field(STATE_NAME, pa.string())], self.variables)
        self.key_fields, self.value_fields = self.schema.key_fields, self.schema.value_fields
        # with timers or TTLs a key's state changes in batches without its rows
        self.holds_keys = self.timers is not None or any(
            v.ttl is not None for v in self.variables.values())
        self.keys: KeyColumns | None = None      # set with the state (_attach)
        self.working: WorkingSet | None = None   # state on the tier: the keys loaded

    # -- state between batches --------------------------------------------------------------
    def rebuild_index(self, state: VersionedState) -> None:
        """Loads the variables' values from the stored rows (after a load from files); on
        the tier, only what the family keeps between batches (see working_set)."""
        if state.prefix_dtype is not None:
            state.objects = tier_objects(state, self.schema)
        else:
            state.objects = self.schema.held_in_memory(state.live_rows(), self.holds_keys)

    def _attach(self, state: VersionedState) -> None:
        if self._attached:
            return
        self._attached = True
        held = state.objects
        if held is None or set(held["variables"]) != set(self.schema.order):
            self.rebuild_index(state)
            held = state.objects
        on_tier = state.prefix_dtype is not None
        self.keys = KeyColumns(self.key_fields[:-1], held["heldKeys"], on_tier)
        if on_tier:
            self.working = WorkingSet(state, self.schema, self.keys)
        for name, var in self.variables.items():
            if var is not self.timers:
                var.data = held["variables"][name]
            if var.ttl is not None and on_tier:
                var.attach_tier(self.working.time_index(held["ttlIndexes"][name]))
            elif var.ttl is not None:
                var.attach_index(held["ttlIndexes"].setdefault(name, []))
        if self.timers is not None and on_tier:
            self.timers.attach_tier(held["variables"][TIMER_VARIABLE],
                                    self.working.time_index(held["timerIndex"]))
        elif self.timers is not None:
            self.timers.attach(held["variables"][TIMER_VARIABLE], held["timerHeap"])
        self.context.total = held["total"]
        for var in self.deleted:
            self.drop_variable(state, var)
        if self.schema.dropped:
            self.drop_rows(state, self.schema.dropped)

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
        return self.output.batch()

    def _flush(self, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        """Real-time mode: one flush of rows, answered whole: handleInputRows once per key
        with rows in it, then the timers due (processing time against the live clock, event
        time against the batch's fixed watermark), as Spark's real-time transformWithState
        checks them after each row. State is written at the batch's end (`finish`)."""
        self._tick()
        with self.updating():
            self._seed()
            # the flush's rows are all the processor gets of them: each key is one call
            for part in grouped_by_key(batch, self.key_indices, self.input.max_rows):
                self._process(part)
            self._call(self.input.rest())
            self._expire_timers()
        return self.output.batch()

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
        """The batch's grouping keys as the variables hold them on the tier (their stored
        rows loaded); None for state in memory (the input's own form)."""
        if self.working is None:
            return None
        groups = self.working.groups([batch.column(i) for i in key_indices], batch.num_rows)
        self.working.load(groups)
        return groups

    def _process(self, batch: pa.RecordBatch) -> None:
        """handleInputRows once per key whose rows are all here (the batch's last key
        waits: its rows may go on in the next batch; see ProcessorInput)."""
        if self.late_threshold is not None and self.event_time_index >= 0:
            late = self.late_mask(*keycodec.event_time_micros(
                batch.column(self.event_time_index)))
            if late.any():   # EventTime mode: Spark drops rows the watermark has passed
                batch = batch.filter(pa.array(~late))
        seen, context = self.keys.seen, self.context
        handle, timer_values, add = (self.processor.handleInputRows, self.timer_values,
                                     self.output.add)
        for group, key_columns, key, items in self.input.whole_keys(
                batch, self.key_indices, self.value_indices,
                self._groups(batch, self.key_indices)):
            seen[group] = key_columns   # inline: this runs per key
            context.group = group
            result = handle(key, iter(items), timer_values)
            if result is not None:
                add(result)
        context.group = NO_KEY

    def _call(self, whole: tuple | None) -> None:
        """handleInputRows for a key ProcessorInput held back, once its rows have all come."""
        if whole is None:
            return
        group, key_columns, key, items = whole
        self.keys.seen[group] = key_columns
        self.context.group = group
        self.output.collect(self.processor.handleInputRows(key, iter(items), self.timer_values))
        self.context.group = NO_KEY

    def initial_state(self, state: VersionedState, batch: pa.RecordBatch) -> None:
        """A batch of the initial state (the query's first batch, before any input rows):
        handleInitialState per key, per DataFrame (pandas) or per Row; a key whose rows go
        on in the next batch is called once they have all come, as for input rows."""
        self._attach(state)
        before, start = self._initial_ns, time.perf_counter_ns()
        k = self.initial_key_count
        with self.updating():
            for whole in self.input.whole_keys(
                    batch, list(range(k)), list(range(k, batch.num_columns)),
                    self._groups(batch, list(range(k))), INITIAL):
                self._initial(whole)
        # the keys handled here are in this time already
        self._initial_ns = before + time.perf_counter_ns() - start
        self.metrics["initialStateProcessingTimeMs"] = self._initial_ns // 1_000_000

    def _seed(self) -> None:
        """handleInitialState for the initial state's last key, once input comes."""
        whole = self.input.rest(INITIAL)
        if whole is None:
            return
        start = time.perf_counter_ns()
        self._initial(whole)
        self._initial_ns += time.perf_counter_ns() - start
        self.metrics["initialStateProcessingTimeMs"] = self._initial_ns // 1_000_000

    def _initial(self, whole: tuple) -> None:
        group, key_columns, key, items = whole
        self.keys.seen.setdefault(group, key_columns)
        self.context.group = group
        for item in items:
            self.processor.handleInitialState(key, item, self.timer_values)
        self.context.group = NO_KEY

    def _expire_timers(self) -> None:
        """handleExpiredTimer for each timer due, then the timer's deletion: pyspark's
        worker's order, after every key's rows."""
        timers = self.timers
        if timers is None:
            return
        start = time.perf_counter_ns()
        for ts, group in timers.expired(self.expiry_threshold):
            key = self._Row(**self.keys.values(group))
            self.context.group = group
            self.output.collect(self.processor.handleExpiredTimer(
                key, self.timer_values, self._ExpiredTimerInfo(ts)))
            timers.delete(ts, group)
            self.context.group = NO_KEY
        self.metrics["timerProcessingTimeMs"] += (time.perf_counter_ns() - start) // 1_000_000

    def finish(self, state: VersionedState) -> Iterator[pa.RecordBatch]:
        self._attach(state)
        self._tick()
        outputs = []
        with self.updating():
            self._seed()
            for batch in self._unsorted.sorted():
                self._process(batch)
                outputs.append(self.output.batch())
            self._call(self.input.rest())
            self._expire_timers()
            self.processor.close()
            for var in self.variables.values():   # Spark's doTtlCleanup, before the commit
                if var.ttl is not None:
                    expired = var.expire()
                    self.metrics["numRemovedStateRows"] += expired
                    self.metrics["numValuesRemovedDueToTTLExpiry"] += expired
            write_batch(state, self.schema, self.keys, self.holds_keys and self.working is None)
            if self.working is not None:   # the tier holds the values now
                self.working.drop()
        self.keys.seen = {}
        state.objects["total"] = self.context.total
        self.metrics["numTotalStateRows"] = self.context.total
        self.close_timings()
        outputs.append(self.output.batch())
        yield from (batch for batch in outputs if batch is not None)
