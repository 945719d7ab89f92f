"""transformWithState's input, cut as pyspark's worker cuts it for the processor: rows
arrive sorted by grouping key, and each key's rows are handed over whole (a key's rows
may span Arrow batches), as DataFrames of at most maxRecordsPerBatch rows (pandas) or as
Rows (Row API). A batch goes one way: its grouping keys and where each key's rows start,
its columns converted once (pandas_io, or Python values for Rows), then cut per key.
"""
from __future__ import annotations

import datetime
import functools
import itertools
import math
import zoneinfo
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ... import keys as keycodec
from ..pandas_io import PandasIO


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


# the microseconds of datetime.min and datetime.max: numpy makes datetimes between them
_DATETIME_RANGE = (-62135596800000000, 253402300799999999)
_DAY_MICROS = 86_400_000_000


def python_column(array: pa.Array) -> list:
    """A column's values as Arrow's to_pylist makes them (what pyspark's worker's as_py()
    per cell gives the Row API), zoned timestamps in bulk: Arrow makes each zoned datetime
    about 4x slower (2.6 us). A zone whose offset never changes (`_fixed_offset`) gets its
    datetimes made from their fields computed in numpy (0.36 us a value); another zone Arrow
    gives as a ZoneInfo goes through pandas, which makes the datetimes in C with that same
    object (0.9 us); what is left (pytz-like zones), per value as Arrow does."""
    t = array.type
    if not (pa.types.is_timestamp(t) and t.unit == "us" and t.tz is not None and len(array)):
        return array.to_pylist()
    micros = pc.fill_null(array.view(pa.int64()), 0).to_numpy(zero_copy_only=False)
    if micros.min() < _DATETIME_RANGE[0] or micros.max() > _DATETIME_RANGE[1]:
        return array.to_pylist()   # Arrow's own error (no datetime holds it)
    zone = pa.scalar(0, t).as_py().tzinfo   # the zone object Arrow gives
    offset = _fixed_offset(zone)
    try:
        if offset is not None:
            wall = micros + offset
            if wall.min() < _DATETIME_RANGE[0] or wall.max() > _DATETIME_RANGE[1]:
                return array.to_pylist()   # as Arrow fails: the zone's time is past datetime
            values = list(map(datetime.datetime, _datetime_states(wall),
                              itertools.repeat(zone)))
        elif isinstance(zone, zoneinfo.ZoneInfo):
            import pandas as pd   # loaded before the fork in the workers of functions
            values = (pd.DatetimeIndex(micros.astype("datetime64[us]")).tz_localize("UTC")
                      .tz_convert(zone).to_pydatetime().tolist())
        else:
            return array.to_pylist()
    except OverflowError:   # a zone's time past datetime's range: as Arrow does
        return array.to_pylist()
    if array.null_count:
        valid = array.is_valid().to_numpy(zero_copy_only=False).tolist()
        values = [v if ok else None for v, ok in zip(values, valid)]
    return values


def _fixed_offset(zone) -> int | None:
    """The zone's offset from UTC in microseconds when it never changes (a fixed-offset
    `timezone`, UTC, or a zone of tzdata's "Etc" area, which holds fixed offsets only),
    else None."""
    if isinstance(zone, datetime.timezone):
        offset = zone.utcoffset(None)
    elif isinstance(zone, zoneinfo.ZoneInfo) and zone.key is not None and (
            zone.key in ("UTC", "UCT", "GMT", "Universal", "Zulu", "Greenwich")
            or zone.key.startswith("Etc/")):
        offset = zone.utcoffset(datetime.datetime(2000, 1, 1))
    else:
        return None
    return offset // datetime.timedelta(microseconds=1)


def _datetime_states(wall: np.ndarray) -> list[bytes]:
    """Wall-clock times (microseconds from 1970-01-01 00:00 on that clock) as the 10-byte
    states datetime's own constructor takes (its pickled form: year in two bytes, month,
    day, hour, minute, second, microsecond in three), the calendar fields computed in numpy
    (days to a civil date: H. Hinnant's algorithm)."""
    days, micros_of_day = np.divmod(wall, _DAY_MICROS)
    z = days + 719468   # days since 0000-03-01
    era = z // 146097
    day_of_era = z - era * 146097
    year_of_era = (day_of_era - day_of_era // 1460 + day_of_era // 36524
                   - day_of_era // 146096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    month_from_march = (5 * day_of_year + 2) // 153
    month = np.where(month_from_march < 10, month_from_march + 3, month_from_march - 9)
    year = year_of_era + era * 400 + (month <= 2)
    seconds, micros = np.divmod(micros_of_day, 1_000_000)
    states = np.empty((len(wall), 10), np.uint8)
    states[:, 0], states[:, 1] = year >> 8, year & 255
    states[:, 2] = month
    states[:, 3] = day_of_year - (153 * month_from_march + 2) // 5 + 1
    states[:, 4], states[:, 5], states[:, 6] = seconds // 3600, seconds // 60 % 60, seconds % 60
    states[:, 7], states[:, 8], states[:, 9] = micros >> 16, (micros >> 8) & 255, micros & 255
    return states.view("V10").ravel().tolist()


def row_class(names: list[str], base: type) -> type:
    """pyspark Rows of these fields (`base`: pyspark's Row), made as cheaply as a Row can be:
    a subclass holds the field names, so a row is one tuple (tuple.__new__(cls, values)).
    Rows of it behave as pyspark's (fields, asDict, pickling as a Row). One class per
    fields: made once, not for each batch (a real-time flush is a batch)."""
    return _row_class(tuple(names), base)


@functools.lru_cache(maxsize=256)
def _row_class(names: tuple[str, ...], base: type) -> type:
    return type("Row", (base,), {"__fields__": list(names)})


def key_bounds(key_batch: pa.RecordBatch, groups: list) -> list[int]:
    """Where each key's rows start in a batch sorted by key, and its length: in numpy for
    one integer or time column without nulls, else from the rows' hashable keys."""
    n = len(groups)
    column = key_batch.column(0) if key_batch.num_columns == 1 else None
    if column is not None and not column.null_count and (
            pa.types.is_integer(column.type) or pa.types.is_temporal(column.type)):
        keys = column.to_numpy(zero_copy_only=False)
        return [0] + (np.flatnonzero(keys[1:] != keys[:-1]) + 1).tolist() + [n]
    return [0] + [i for i in range(1, n) if groups[i] != groups[i - 1]] + [n]


INPUT, INITIAL = "input", "initial"   # the streams of rows sorted by key a task gets


class ProcessorInput:
    """A task's rows, per grouping key whole, as the processor gets them: the input rows
    (INPUT) and the initial state's (INITIAL), each a stream sorted by key in batches."""

    def __init__(self, operator: dict[str, Any], io: PandasIO, row_class: type) -> None:
        self.io, self._Row = io, row_class
        self.pandas = operator["pandas"]
        # pyspark's worker: at most this many rows per DataFrame (none when not positive),
        # and, when a bytes limit is set, rows x average Arrow row size under it
        records = operator["maxRecordsPerBatch"]
        self.max_rows = records if records > 0 else 2**31 - 1
        self.max_bytes = operator.get("maxBytesPerBatch", 2**31 - 1)
        self._seen_bytes = self._seen_rows = 0
        # per stream, its last batch's last key: [group, key columns, key, items, whether
        # its rows span batches]
        self._waiting: dict[str, list | None] = {INPUT: None, INITIAL: None}

    def whole_keys(self, batch: pa.RecordBatch, key_indices: list[int],
                   value_indices: list[int], groups: list | None = None,
                   stream: str = INPUT) -> Iterator[tuple]:
        """Per grouping key of the stream whose rows are all here, in order: the key
        (hashable: `groups`' item of its rows, by default the key columns' values), where
        its columns are (key batch, row), the key as the processor gets it, and its rows as
        the processor gets them (pandas: DataFrames of at most maxRecordsPerBatch rows; Row
        API: Rows). The batch's last key waits, its rows may go on in the stream's next
        batch: the next key hands it over, or `rest` once the stream ends."""
        n = batch.num_rows
        if n == 0:
            return
        key_batch = batch.select(key_indices)
        if groups is None:
            groups = keycodec.rows(key_batch.columns, n)
        bounds = key_bounds(key_batch, groups)
        if self.pandas:
            frame, keys = self._pandas_columns(batch, key_indices, value_indices)
            if self.max_bytes != 2**31 - 1:
                self._seen_bytes += sum(b.size for c in batch.columns for b in c.buffers()
                                        if b is not None)
                self._seen_rows += n
        else:   # Python values once per batch: what as_py() per cell gives pyspark's worker
            columns = [python_column(batch.column(i)) for i in value_indices]
            keys = [python_column(batch.column(i)) for i in key_indices]
            DataRow = row_class([batch.schema.names[i] for i in value_indices], self._Row)
            rows = list(map(functools.partial(tuple.__new__, DataRow), zip(*columns)))
        single = keys[0] if len(keys) == 1 else None
        waiting, self._waiting[stream] = self._waiting[stream], None
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            items = self._chunks(frame, lo, hi) if self.pandas else rows[lo:hi]
            group = groups[lo]
            if waiting is not None:   # the stream's last key so far, before the batch
                if waiting[0] == group:   # its rows go on here
                    waiting[3].extend(items)
                    waiting[4] = True
                    continue
                yield self._whole(waiting)
                waiting = None
            key = (single[lo],) if single is not None else tuple(k[lo] for k in keys)
            if hi == n:
                waiting = [group, (key_batch, lo), key, items, False]
            else:
                yield group, (key_batch, lo), key, items
        self._waiting[stream] = waiting

    def _pandas_columns(self, batch: pa.RecordBatch, key_indices: list[int],
                        value_indices: list[int]) -> tuple[Any, list]:
        """The batch's value columns as one DataFrame and its key columns' values, as
        pyspark's worker makes them (Python scalars, from pandas): from Arrow directly for
        the plain types (PandasIO.plain_frame), else through pyspark's conversion."""
        frame = self.io.plain_frame(batch, value_indices)
        if frame is None:
            series = self.io.to_pandas(batch)
            frame = _as_from_rows(self.io.frame_of([series[i] for i in value_indices]))
            return frame, [series[i].tolist() for i in key_indices]
        keys = self.io.plain_values(batch, key_indices)
        if keys is None:
            keys = [s.tolist() for s in self.io.to_pandas(batch.select(key_indices))]
        return frame, keys

    def rest(self, stream: str = INPUT) -> tuple | None:
        """The stream's last key, whole, once no more of its rows come (None if none
        waits), as `whole_keys` gives a key."""
        waiting, self._waiting[stream] = self._waiting[stream], None
        return None if waiting is None else self._whole(waiting)

    def _whole(self, waiting: list) -> tuple:
        """A waiting key as the processor gets it: DataFrames from two Arrow batches are
        joined and cut anew from the key's start, as pyspark's worker cuts them."""
        group, key_columns, key, items, spans_batches = waiting
        if spans_batches and self.pandas:
            items = self._chunks(self.io.pd.concat(items, ignore_index=True), 0, None)
        return group, key_columns, key, items

    def _chunks(self, frame, lo: int, hi: int | None) -> list:
        """Rows lo..hi of a frame as the DataFrames pyspark's worker hands over."""
        hi = len(frame) if hi is None else hi
        size = self.max_rows
        if self.max_bytes != 2**31 - 1 and self._seen_rows:
            average = self._seen_bytes / self._seen_rows
            size = min(size, max(1, math.ceil(self.max_bytes / average)))
        chunks = []
        for start in range(lo, hi, size):
            chunks.append(self.io.frame_rows(frame, start, min(hi, start + size)))
        return chunks
