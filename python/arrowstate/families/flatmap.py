"""applyInPandasWithState, with the user's function in the worker that holds the state.

Semantics follow Spark's FlatMapGroupsInPandasWithStateExec and its InputProcessor:
- rows arrive sorted by group, in batches of at most maxRecordsPerBatch rows, late rows
  already dropped by the JVM; a group's rows are the DataFrames the function iterates over,
  one per batch it spans (Spark's chunks);
- the function gets the key tuple, the chunks and a pyspark GroupState; after its output is
  consumed the state is removed (removed, no timeout), or written (updated, removed or a
  timeout set), or left alone;
- after all input, groups whose timeout is below the threshold (batch time or eviction
  watermark) are called with hasTimedOut and one empty DataFrame. Timeouts sit in a time
  index, so this touches only what expires.
Only input rows and output rows cross the bridge; state never leaves this process.
"""
from __future__ import annotations

import base64
import functools
import itertools
import json
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from ..spark_state.flatmap import LAYOUT
from ..spark_state.layout import arrow_fields
from ..store.versions.versioned import VersionedState
from .base import (STORE_METRICS, FamilyBase, UnsortedInput, gather_rows, grouped_by_key,
                   live_clock_ms)
from .group_state_values import StateValueWriter, python_values
from .pandas_io import PandasIO

NO_TIMESTAMP = -1
DEFINED, TIMEOUT = "__defined", "__timeout"


class _Group:
    """A group whose rows may continue in the next batch."""
    __slots__ = ("hkey", "key", "chunks", "key_batch", "key_row", "stored")

    def __init__(self, hkey, key, key_batch, key_row, stored):
        self.hkey, self.key, self.chunks = hkey, key, []
        self.key_batch, self.key_row, self.stored = key_batch, key_row, stored


_PYTHON_SCALARS = frozenset((int, float, str, bool, bytes, type(None)))


def _stored_form(value):
    """A value as pyspark's GroupState.update keeps it: numpy scalars and pandas' time types
    made Python's (tried in pyspark's order), anything else as it is."""
    if type(value) in _PYTHON_SCALARS:
        return value
    if isinstance(value, np.generic):
        return value.tolist()
    for method in ("to_pytimedelta", "to_pydatetime"):
        convert = getattr(value, method, None)
        if convert is not None:
            return convert()
    return value


@functools.cache
def group_state_class() -> type:
    """pyspark's GroupState, with update() doing what pyspark's does without the import
    statement pyspark's runs on every call (2.5 us of a group's time: `from
    pyspark.testing.utils import have_numpy`; numpy is always here)."""
    from pyspark.errors import PySparkTypeError
    from pyspark.sql.streaming.state import GroupState
    from pyspark.sql.types import Row

    class ArrowStateGroupState(GroupState):
        __doc__ = GroupState.__doc__

        def update(self, newValue) -> None:
            if newValue is None:
                raise PySparkTypeError(errorClass="CANNOT_BE_NONE",
                                       messageParameters={"arg_name": "newValue"})
            self._value = Row(*map(_stored_form, newValue))
            self._defined, self._updated, self._removed = True, True, False

        def outcome(self) -> tuple[bool, bool, int]:
            """What the function did to it: (updated, removed, timeout timestamp).

            pyspark's own worker reads these from `json()`; they are read from the
            attributes json() reads, sparing a JSON round trip a group, and through json()
            where a pyspark has other attributes."""
            try:
                return self._updated, self._removed, self._timeout_timestamp
            except AttributeError:
                outcome = json.loads(self.json())
                return outcome["updated"], outcome["removed"], outcome["timeoutTimestamp"]

    ArrowStateGroupState.update.__doc__ = GroupState.update.__doc__
    return ArrowStateGroupState


class FlatMapGroupsWithState(FamilyBase):
    name = "flatMapGroupsWithState"
    layout = LAYOUT
    tiered = True

    def __init__(self, operator: dict[str, Any], input_schema: pa.Schema):
        super().__init__(operator, STORE_METRICS)
        import pandas as pd
        from pyspark.errors import PySparkRuntimeError, PySparkTypeError
        from pyspark.serializers import CloudPickleSerializer
        from pyspark.sql.types import (BooleanType, ByteType, DoubleType, FloatType,
                                       IntegerType, LongType, Row, ShortType, StringType,
                                       StructType)

        self._pd, self._Row, self._GroupState = pd, Row, group_state_class()
        self._TypeError, self._RuntimeError = PySparkTypeError, PySparkRuntimeError
        self.io = PandasIO(operator)

        self.func, _ = CloudPickleSerializer().loads(base64.b64decode(operator["command"]))
        self.key_indices = operator["keyIndices"]
        self.value_count = operator["valueCount"]
        self.timeout_conf = operator["timeoutConf"]
        self.batch_ts = operator["batchTimestampMs"]
        self.watermark = operator["eventTimeWatermarkMs"]
        self.watermark_present = operator["watermarkPresent"]
        self.state_schema = StructType.fromJson(json.loads(operator["stateSchema"]))
        self._plain_state = all(
            isinstance(f.dataType, (BooleanType, ByteType, ShortType, IntegerType, LongType,
                                    FloatType, DoubleType, StringType))
            for f in self.state_schema.fields)
        self.value_names = input_schema.names[: self.value_count]
        self.key_fields = [input_schema.field(i) for i in self.key_indices]
        self.state_fields = arrow_fields(self.state_schema, self.io.timezone)
        self._state_writer = StateValueWriter(self.state_schema, self.state_fields)
        self.value_fields = self.state_fields + [pa.field(DEFINED, pa.bool_()),
                                                 pa.field(TIMEOUT, pa.int64())]
        self.timeout_column = len(self.key_fields) + len(self.value_fields) - 1
        self.defined_column = self.timeout_column - 1
        self._pending: _Group | None = None
        self.real_time = bool(operator.get("realTime"))
        records = operator.get("maxRecordsPerBatch", 0)
        self._unsorted = UnsortedInput(operator, self.key_indices,
                                       records if records > 0 else 2**31 - 1)
        self._puts: list = []      # (hkey, key batch, row, value tuple or None, timeout)
        self._removes: list = []
        self._unchanged_timeouts: list = []   # timed-out groups whose state was left alone

    # -- state ------------------------------------------------------------------------------
    def _index(self, state: VersionedState, keys, timeouts: np.ndarray) -> None:
        state.index.add_many(timeouts, state.as_keys(keys), timeouts != NO_TIMESTAMP)

    def index_rows(self, state: VersionedState, keys: list, rows: pa.RecordBatch) -> None:
        """Indexes groups by their timeout timestamp (none: never times out)."""
        self._index(state, keys, rows.column(self.timeout_column).to_numpy(zero_copy_only=False))

    def _stored_values(self, rows: pa.RecordBatch) -> list:
        """Per stored row: the state value tuple, or None where none is defined. Values are
        in the form pyspark gives Python code for the state schema's types (a timestamp as
        a naive local datetime, as natively), not Arrow's."""
        nk = len(self.key_fields)
        defined = rows.column(self.defined_column).to_pylist()
        if not self.state_fields:
            return [() if d else None for d in defined]
        if self._plain_state:   # numbers, booleans, strings: Arrow's Python values are pyspark's
            columns = [rows.column(nk + i).to_pylist() for i in range(len(self.state_fields))]
            return [v if d else None for v, d in zip(zip(*columns), defined)]
        values = python_values(rows.columns[nk:nk + len(self.state_fields)], self.state_schema)
        return [v if d else None for v, d in zip(values, defined)]

    # -- calling the function ---------------------------------------------------------------
    def _group_state(self, stored, timed_out: bool):
        return self._GroupState(
            optionalValue=None if stored is None else self._Row(*stored),
            batchProcessingTimeMs=self.batch_ts, eventTimeWatermarkMs=self.watermark,
            timeoutConf=self.timeout_conf, hasTimedOut=timed_out,
            watermarkPresent=self.watermark_present, defined=stored is not None,
            updated=False, removed=False, timeoutTimestamp=NO_TIMESTAMP,
            keyAsUnsafe=None, valueSchema=self.state_schema)

    def _call(self, group: _Group, timed_out: bool) -> None:
        pd, PySparkTypeError = self._pd, self._TypeError
        state = self._group_state(group.stored, timed_out)
        chunks = [pd.DataFrame(columns=self.value_names)] if timed_out else group.chunks
        result = self.func(group.key, iter(chunks), state)
        if isinstance(result, pd.DataFrame):
            raise PySparkTypeError(errorClass="UDF_RETURN_TYPE", messageParameters={
                "expected": "iterable of pandas.DataFrame", "actual": type(result).__name__})
        try:
            result = iter(result)
        except TypeError:
            raise PySparkTypeError(errorClass="UDF_RETURN_TYPE", messageParameters={
                "expected": "iterable", "actual": type(result).__name__}) from None
        width = len(self.io.output_schema)
        for pdf in result:
            if not isinstance(pdf, pd.DataFrame):
                raise PySparkTypeError(errorClass="UDF_RETURN_TYPE", messageParameters={
                    "expected": "iterator of pandas.DataFrame",
                    "actual": "iterator of {}".format(type(pdf).__name__)})
            if not (len(pdf.columns) == width or (len(pdf.columns) == 0 and pdf.empty)):
                raise self._RuntimeError(errorClass="RESULT_COLUMN_SCHEMA_MISMATCH",
                                          messageParameters={"expected": str(width),
                                                             "actual": str(len(pdf.columns))})
            if len(pdf) > 0:
                self.io.outputs.append(pdf)
        # The output is consumed: record what becomes of the state, as Spark does.
        updated, removed, timeout = state.outcome()
        if removed and timeout == NO_TIMESTAMP:
            self._removes.append(group.hkey)
            self.metrics["numRemovedStateRows"] += 1
        elif updated or removed or timeout != NO_TIMESTAMP:
            value = state.getOption
            self._puts.append((group.hkey, group.key_batch, group.key_row, value, timeout))
            self.metrics["numUpdatedStateRows"] += 1
        elif timed_out:
            self._unchanged_timeouts.append(group)

    def _write(self, state: VersionedState) -> None:
        """Applies the recorded state changes, in order of the calls."""
        if self._removes:
            state.pop_present(self._removes)
            self._removes = []
        if not self._puts:
            return
        puts, self._puts = self._puts, []
        keys_batch = gather_rows([(p[1], p[2]) for p in puts],
                                 state.schema.names[: len(self.key_fields)])
        values = [p[3] for p in puts]
        columns = list(keys_batch.columns) + self._state_writer.columns(values)
        columns.append(pa.array([v is not None for v in values], pa.bool_()))
        timeouts = np.array([p[4] for p in puts], dtype=np.int64)
        columns.append(pa.array(timeouts))
        hkeys = [p[0] for p in puts]
        state.put_rows(hkeys, pa.RecordBatch.from_arrays(columns, schema=state.schema))
        self._index(state, hkeys, timeouts)

    # -- one micro-batch --------------------------------------------------------------------
    def process(self, state: VersionedState, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        if self._unsorted.hold(batch):
            return None
        if self.real_time:
            return self._flush(state, batch)
        with self.updating():
            self._process(state, batch)
        return self.io.output_batch()

    def _flush(self, state: VersionedState, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        """Real-time mode: one flush of rows, answered whole. Each key with rows in it is
        called once, its state written, and then, with processing-time timeouts, the groups
        whose timeout the live clock has passed; the output is the flush's."""
        if self.timeout_conf == "ProcessingTimeTimeout":
            self.batch_ts = live_clock_ms()
        with self.updating():
            # the flush's rows are all the function gets of them: each key is one call
            for part in grouped_by_key(batch, self.key_indices, self._unsorted.max_rows):
                self._process(state, part)
            if self._pending is not None:
                self._call(self._pending, timed_out=False)
                self._pending = None
            self._write(state)
        if self.timeout_conf == "ProcessingTimeTimeout":
            with self.removing():
                self._timeouts(state, self.batch_ts)
        return self.io.output_batch()

    def _process(self, state: VersionedState, batch: pa.RecordBatch) -> None:
        n = batch.num_rows
        key_batch = batch.select(self.key_indices)
        hkeys = state.keys(key_batch.columns, n)
        if isinstance(hkeys, np.ndarray):
            starts = (np.flatnonzero(hkeys[1:] != hkeys[:-1]) + 1).tolist()
        else:
            starts = [i for i in range(1, n) if hkeys[i] != hkeys[i - 1]]
        boundaries = [0] + starts + [n]
        # One conversion per batch; each group's rows are a slice of it, re-indexed from 0
        # as PySpark's own per-group frames are. PySpark converts each group's slice on its
        # own, so a column with nulls (whose pandas dtype depends on whether the group's own
        # rows hold one: int64 or float64) is converted with its nulls filled for the groups
        # without one, and per group for the groups with one.
        with_nulls = [i for i in range(self.value_count) if batch.column(i).null_count]
        nullable = batch.select(with_nulls) if with_nulls else None
        filled = _nulls_filled(batch, with_nulls) if with_nulls else batch
        frame = self.io.plain_frame(filled, list(range(self.value_count)))
        series = None   # the columns through pyspark's conversion, where they are needed
        if frame is None:
            series = self.io.to_pandas(filled)
            frame = self.io.frame_of(series[: self.value_count])
        if with_nulls:   # per group, whether each such column holds a null in its rows
            nulls = np.stack([np.concatenate([[0], np.cumsum(
                nullable.column(j).is_null().to_numpy(zero_copy_only=False))])
                for j in range(len(with_nulls))])
            group_nulls = (nulls[:, boundaries[1:]] - nulls[:, boundaries[:-1]]) > 0
        if series is None or any(i in with_nulls for i in self.key_indices):   # as they are
            key_arrays = [c.array for c in self.io.to_pandas(batch.select(self.key_indices))]
        else:
            key_arrays = [series[i].array for i in self.key_indices]
        ids = state.lookup(state.pick(hkeys, boundaries[:-1]))
        found = np.flatnonzero(ids >= 0)
        stored: list = [None] * len(ids)
        for g, value in zip(found.tolist(), self._stored_values(state.take(ids[found]))):
            stored[g] = value
        for g, (lo, hi) in enumerate(zip(boundaries[:-1], boundaries[1:])):
            chunk = self.io.frame_rows(frame, lo, hi)
            if nullable is not None and group_nulls[:, g].any():
                chunk = chunk.copy()
                for i, column, held in zip(with_nulls,
                                           self.io.to_pandas(nullable.slice(lo, hi - lo)),
                                           group_nulls[:, g]):
                    if held:
                        chunk.isetitem(i, column)
            pending = self._pending
            if pending is not None and pending.hkey == hkeys[lo]:
                pending.chunks.append(chunk)
                continue
            if pending is not None:
                self._call(pending, timed_out=False)
            group = _Group(hkeys[lo], tuple(a[lo] for a in key_arrays), key_batch, lo,
                           stored[g])
            group.chunks.append(chunk)
            self._pending = group
        self._write(state)

    def finish(self, state: VersionedState) -> Iterator[pa.RecordBatch]:
        outputs = []
        with self.updating():
            for batch in self._unsorted.sorted():
                self._process(state, batch)
                outputs.append(self.io.output_batch())
            if self._pending is not None:
                self._call(self._pending, timed_out=False)
                self._pending = None
            self._write(state)
        outputs.append(self.io.output_batch())
        yield from (batch for batch in outputs if batch is not None)

        if self.real_time and self.timeout_conf == "ProcessingTimeTimeout":
            self.batch_ts = live_clock_ms()
        with self.removing():
            threshold = {"ProcessingTimeTimeout": self.batch_ts,
                         "EventTimeTimeout": self.watermark}.get(self.timeout_conf)
            if threshold is not None and threshold != NO_TIMESTAMP:
                self._timeouts(state, threshold)
        self.close_timings()
        batch = self.io.output_batch()
        if batch is not None:
            yield batch

    def _timeouts(self, state: VersionedState, threshold: int) -> None:
        """Calls the function for each group whose timeout is below the threshold."""
        hkeys, times = state.index.pop_until(threshold - 1)
        ids = state.lookup(hkeys)
        found = ids >= 0
        rows = state.take(ids[found])
        current = rows.column(self.timeout_column).to_numpy(zero_copy_only=False)
        due = np.flatnonzero(current == times[found])
        due_keys = list(itertools.compress(hkeys, found.tolist()))
        seen: set = set()
        stored = self._stored_values(rows)
        key_batch = rows.select(range(len(self.key_fields)))
        # the key tuples as the function sees them: from pandas, as for groups with data
        key_arrays = [s.array for s in self.io.to_pandas(key_batch)]
        for i in due.tolist():
            hkey = due_keys[i]
            if hkey in seen:
                continue
            seen.add(hkey)
            group = _Group(hkey, tuple(a[i] for a in key_arrays), key_batch, i, stored[i])
            self._call(group, timed_out=True)
        # a timed-out group whose function left its state alone keeps its old timeout
        kept = self._unchanged_timeouts
        self._index(state, [g.hkey for g in kept],
                    np.array([current[g.key_row] for g in kept], dtype=np.int64))
        self._unchanged_timeouts = []
        self._write(state)


def _nulls_filled(batch: pa.RecordBatch, columns: list[int]) -> pa.RecordBatch:
    """The batch with each null of these columns replaced by the column's first valid
    value: converted to pandas, its rows hold what a null-free slice's conversion holds."""
    arrays = list(batch.columns)
    for i in columns:
        valid = arrays[i].is_valid().to_numpy(zero_copy_only=False)
        first = int(valid.argmax())
        if valid[first]:
            arrays[i] = arrays[i].take(pa.array(np.where(valid, np.arange(len(valid)), first)))
    return pa.RecordBatch.from_arrays(arrays, schema=batch.schema)
