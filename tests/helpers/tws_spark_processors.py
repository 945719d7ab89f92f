"""Stateful processors for the scenarios of Spark's own PySpark transformWithState tests
(python/pyspark/sql/tests/pandas/streaming/test_pandas_transform_with_state*.py and their
helper module), written afresh for the differential harness (tests/helpers/harness.py).

Where Spark's processors assert inside the worker, these report what they saw in their
output rows, so the run on Spark and the run on arrowstate are compared value by value
and the test can also hold Spark's run to Spark's own expectations.

Every processor serves both APIs: `pandas=True` for transformWithStateInPandas (pandas
DataFrames in and out), `pandas=False` for transformWithState (Rows in and out). Pickled
by value (the tests register this module), so workers need not import it.
"""
import datetime as dt
import hashlib
import json
import sys

import pandas as pd
from pyspark.errors import PySparkRuntimeError
from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import StatefulProcessor
from pyspark.sql.types import (ArrayType, DoubleType, IntegerType, MapType, StringType,
                               StructField, StructType, TimestampType)


def _int_field(name):
    return StructType([StructField(name, IntegerType(), True)])


class _BothApis(StatefulProcessor):
    """Reads a key's input as chunks and writes output records, for either API."""

    def __init__(self, pandas=True):
        self.pandas = pandas

    def _chunks(self, rows, *columns):
        """The key's input as a list of chunks, each a list of value tuples of `columns`:
        one chunk per DataFrame (pandas API), one per Row (Row API), which is the unit
        Spark's processors act on in each API."""
        if self.pandas:
            return [list(zip(*(pdf[c].tolist() for c in columns))) for pdf in rows]
        return [[tuple(row[c] for c in columns)] for row in rows]

    def _emit(self, records):
        """Output records (dicts in the output schema's order)."""
        if self.pandas:
            if records:
                yield pd.DataFrame(records)
        else:
            for record in records:
                yield Row(**record)



# --------------------------------------------------------------------------------------------
# test_transform_with_state_basic / test_transform_with_state_query_restarts
# (SimpleStatefulProcessor in Spark's helper module)

class ViolationCount(_BothApis):
    """Per id: the batch's row count (as a string) and a running count of temperatures over
    100 in a value state declared with a DDL string; a second value state declared with a
    StructType. With `drop_scratch`, that second variable is deleted in init() and the
    processor reports what exists() on it does afterwards (Spark raises)."""

    OUTPUT = "id string, countAsString string, violations int, previous int, scratch string"

    def __init__(self, pandas=True, drop_scratch=False):
        super().__init__(pandas)
        self.drop_scratch = drop_scratch

    def init(self, handle):
        self.violations = handle.getValueState("numViolations", "value int")
        self.scratch = handle.getValueState("tempState", _int_field("value"))
        if self.drop_scratch:
            handle.deleteIfExists("tempState")

    def _scratch_probe(self):
        if not self.drop_scratch:
            return "kept"
        try:
            return f"exists() answered {self.scratch.exists()}"
        except PySparkRuntimeError as e:
            known = "Error checking value state exists" in str(e)
            return f"exists() raised {type(e).__name__}, Spark's message: {known}"

    def handleInputRows(self, key, rows, timerValues):
        scratch = self._scratch_probe()
        previous = self.violations.get()[0] if self.violations.exists() else None
        temperatures = [t for chunk in self._chunks(rows, "temperature")
                        for (t,) in chunk if t is not None]
        total = (previous or 0) + sum(1 for t in temperatures if t > 100)
        self.violations.update((total,))
        yield from self._emit([{"id": key[0], "countAsString": str(len(temperatures)),
                                "violations": total, "previous": previous,
                                "scratch": scratch}])


# --------------------------------------------------------------------------------------------
# The state variable tour: the scenarios of test_pandas_transform_with_state_state_variable.py
# (ListStateProcessor, ListStateLargeListProcessor, MapStateProcessor,
# InvalidSimpleStatefulProcessor) and test_transform_with_state_large_values
# (LargeValueStatefulProcessor), each a part with its own state variables and output columns.

LIST_SEED = [(120,), (20,)]
STAMP_BASE = dt.datetime(2024, 5, 17, 9, 30)


class _ListOperations:
    """put, appendValue and appendList on two lists for every chunk, then reads both lists
    through interleaved iterators (and a third one over the first list); finally puts a
    timestamp list. Spark's processor stores processing time + 1 minute, which differs
    between runs; here a fixed time + the chunk's position."""

    columns = "countAsString string, listReads string, listLeft string, stamps string"

    def init(self, handle):
        element = _int_field("temperature")
        self.first = handle.getListState("listState1", element)
        self.second = handle.getListState("listState2", element)
        self.stamps = handle.getListState(
            "listStateTimestamp", StructType([StructField("time", TimestampType(), True)]))

    def run(self, key, chunks):
        count, stamps = 0, []
        for chunk in chunks:
            for state, extra in ((self.first, 111), (self.second, 222)):
                state.put(LIST_SEED)
                state.appendValue((extra,))
                state.appendList(LIST_SEED)
            count += sum(1 for (t,) in chunk if t is not None)
            stamps.append((STAMP_BASE + dt.timedelta(minutes=len(stamps) + 1),))
        a, b = self.first.get(), self.second.get()
        reads = [next(a), next(b), next(a), next(b)]
        c = self.first.get()
        reads += [next(c), next(c)]
        reads += [next(a), next(b), next(c)]
        reads += [next(a), next(b), next(c), next(a), next(b), next(c)]
        left = [len(list(it)) for it in (a, b, c)]
        if stamps:
            self.stamps.put(stamps)
        return {"countAsString": str(count),
                "listReads": ",".join(str(r[0]) for r in reads),
                "listLeft": repr(left),
                "stamps": repr([tuple(s) for s in self.stamps.get()])}


class _LargeList:
    """A list of (value, valueNull) pairs: 100 in the first batch (put for id 0,
    appendList for the others), 90 more in each later one (a longer put for id 0, an
    appendList of the next 90 for the others), its size kept in a value state."""

    columns = "prevElements string, updatedElements string, largeListCheck string"

    def init(self, handle):
        self.items = handle.getListState("listState", StructType(
            [StructField("value", IntegerType(), True),
             StructField("valueNull", IntegerType(), True)]))
        self.size = handle.getValueState("listSizeState", _int_field("size"))

    def run(self, key, chunks):
        before = list(self.items.get())
        if not before:
            check = f"first batch, size state {self.size.get()!r}"
            added = [(i, None) for i in range(100)]
            (self.items.put if key == ("0",) else self.items.appendList)(added)
            self.size.update((len(added),))
        else:
            size = self.size.get()[0]
            check = (f"size {size}, matches {size == len(before)}, "
                     f"as written {before == [(i, None) for i in range(size)]}")
            if key == ("0",):
                self.items.put([(i, None) for i in range(size + 90)])
            else:
                self.items.appendList([(i, None) for i in range(size, size + 90)])
            self.size.update((size + 90,))
        return {"prevElements": ",".join(str(v[0]) for v in before),
                "updatedElements": ",".join(str(v[0]) for v in self.items.get()),
                "largeListCheck": check}


class _MapOperations:
    """A map declared with DDL strings: two entries updated by the batch's count, then
    keys(), values(), iterator(), removeKey, containsKey, exists and clear, as observed."""

    columns = "mapCount string, mapTour string"

    def init(self, handle):
        self.entries = handle.getMapState("mapState", "name string", "count int")

    def run(self, key, chunks):
        count = sum(1 for chunk in chunks for (t,) in chunk if t is not None)
        one, two = ("key1",), ("key2",)
        first = second = count
        existed = self.entries.exists()
        if existed:
            if self.entries.containsKey(one):
                first += self.entries.getValue(one)[0]
            if self.entries.containsKey(two):
                second += self.entries.getValue(two)[0]
        self.entries.updateValue(one, (first,))
        self.entries.updateValue(two, (second,))
        keys = [k[0] for k in self.entries.keys()]
        values = [v[0] for v in self.entries.values()]
        pairs = [(k[0], v[0]) for k, v in self.entries.iterator()]
        self.entries.removeKey(one)
        after_remove = (self.entries.containsKey(one), self.entries.exists())
        self.entries.clear()
        tour = (f"existed {existed}; keys {keys}; values {values}; pairs {pairs}; "
                f"after removeKey(key1): contains {after_remove[0]}, exists {after_remove[1]}; "
                f"after clear: exists {self.entries.exists()}")
        return {"mapCount": str(count), "mapTour": tour}


class _MissingValue:
    """A value state that is never written: exists(), get() and clear() on it."""

    columns = "missingValue string"

    def init(self, handle):
        self.never = handle.getValueState("numViolations", _int_field("value"))

    def run(self, key, chunks):
        seen = f"exists {self.never.exists()}, get {self.never.get()!r}"
        self.never.clear()
        return {"missingValue": seen}


LARGE = "a" * (512 * 1024)


def _digest(text):
    return f"{len(text)}:{hashlib.sha256(text.encode()).hexdigest()[:16]}"


class _LargeValues:
    """512 KiB strings in a value, a list (three of them) and a map, read back at once;
    reported as length and digest (the strings themselves would make failures unreadable)."""

    columns = "largeValue string, largeList string, largeMap string"

    def init(self, handle):
        self.value = handle.getValueState(
            "largeValueState", StructType([StructField("value", StringType(), True)]))
        self.items = handle.getListState(
            "largeListState", StructType([StructField("value", StringType(), True)]))
        self.entries = handle.getMapState("largeMapState", "key string", "value string")

    def run(self, key, chunks):
        self.value.update((LARGE,))
        self.items.put([(LARGE,), (LARGE + "b",), (LARGE + "c",)])
        self.entries.updateValue(("large_string_key",), (LARGE,))
        return {"largeValue": _digest(self.value.get()[0]),
                "largeList": _digest(",".join(v[0] for v in self.items.get())),
                "largeMap": _digest("large_string_key:"
                                    + self.entries.getValue(("large_string_key",))[0])}


TOUR_PARTS = {"list": _ListOperations, "largeList": _LargeList, "map": _MapOperations,
              "missing": _MissingValue, "large": _LargeValues}


def tour_output(parts):
    return ", ".join(["id string"] + [TOUR_PARTS[p].columns for p in parts])


class StateVariableTour(_BothApis):
    """Runs the chosen parts for every key, in order, each on the key's temperature
    chunks; one output row per key with every part's columns."""

    def __init__(self, parts, pandas=True):
        super().__init__(pandas)
        self.parts = [TOUR_PARTS[p]() for p in parts]

    def init(self, handle):
        for part in self.parts:
            part.init(handle)

    def handleInputRows(self, key, rows, timerValues):
        chunks = self._chunks(rows, "temperature")
        record = {"id": key[0]}
        for part in self.parts:
            record.update(part.run(key, chunks))
        yield from self._emit([record])


# --------------------------------------------------------------------------------------------
# test_transform_with_state_in_pandas_composite_type (StatefulProcessorCompositeType) and
# test_composite_output_schema (CompositeOutputProcessor), in one processor

ADDRESS_TYPE = StructType([StructField("road_id", IntegerType()),
                           StructField("city", StringType())])
OBJECT_SCHEMA = StructType([
    StructField("id", ArrayType(IntegerType())),
    StructField("tags", ArrayType(ArrayType(StringType()))),
    StructField("metadata", ArrayType(StructType([StructField("key", StringType()),
                                                  StructField("value", StringType())]))),
    StructField("address", ArrayType(ADDRESS_TYPE)),
])
MAP_VALUE_SCHEMA = StructType([
    StructField("id", IntegerType(), True),
    StructField("attributes", MapType(StringType(), ArrayType(IntegerType())), True),
    StructField("confs", MapType(StringType(), MapType(StringType(), IntegerType()), True),
                True),
])
INNER = StructType([StructField("intValue", IntegerType(), True),
                    StructField("doubleValue", DoubleType(), True),
                    StructField("arrayValue", ArrayType(StringType()), True),
                    StructField("mapValue", MapType(StringType(), StringType()), True)])
COMPOSITE_OUTPUT = StructType([
    StructField("id", StringType(), True),
    StructField("value_arr", StringType(), True),
    StructField("list_state_arr", StringType(), True),
    StructField("map_state_arr", StringType(), True),
    StructField("nested_map_state_arr", StringType(), True),
    StructField("checks", StringType(), True),
    StructField("primitiveValue", StringType(), True),
    StructField("listOfPrimitive", ArrayType(StringType()), True),
    StructField("mapOfPrimitive", MapType(StringType(), StringType()), True),
    StructField("listOfComposite", ArrayType(INNER), True),
    StructField("mapOfComposite", MapType(StringType(), INNER), True),
])


def _plain(x):
    """numpy scalars as Python numbers, for json.dumps."""
    return x.item() if hasattr(x, "item") else x


class CompositeTypes(_BothApis):
    """Arrays, maps, structs and their nestings in a value, a list and a map state (the
    summed temperature of the batch threaded through them), plus a running row count that
    drives an output of arrays and maps of structs."""

    TAGS = [["dummy1", "dummy2"], ["dummy3"]]
    METADATA = [{"key": "env", "value": "prod"}, {"key": "region", "value": "us-west"}]
    ATTRIBUTES = {"key1": [1], "key2": [10]}
    CONFS = {"e1": {"e2": 5, "e3": 10}}
    ADDRESSES = [(1, "Seattle"), (3, "SF")]

    def init(self, handle):
        self.obj = handle.getValueState("obj_state", OBJECT_SCHEMA)
        self.objects = handle.getListState("list_state", OBJECT_SCHEMA)
        self.by_name = handle.getMapState("map_state", "name string", MAP_VALUE_SCHEMA)
        self.count = handle.getValueState("count_state", _int_field("value"))

    def _value_state(self, total):
        if not self.obj.exists():
            ids, checks = [0], "new"
        else:
            ids, tags, metadata, address = self.obj.get()
            checks = (f"tags {tags == self.TAGS}, "
                      f"metadata {metadata == [Row(**m) for m in self.METADATA]}, "
                      f"address {address == [Row(road_id=r, city=c) for r, c in self.ADDRESSES]}")
            ids = [int(i + total) for i in ids]
        self.obj.update((ids, self.TAGS, self.METADATA, self.ADDRESSES))
        return ids, checks

    def _list_state(self, total, ids):
        rewritten = []
        for item_ids, tags, metadata, address in self.objects.get():
            item_ids.append(total)   # numpy int64 from the pandas API, as in Spark's test
            rewritten.append((item_ids, tags, [m.asDict() for m in metadata], address))
        if not rewritten:
            rewritten = [(ids, self.TAGS, self.METADATA, self.ADDRESSES)]
        self.objects.put(rewritten)
        return [i for item in rewritten for i in item[0]]

    def _map_state(self, name, total):
        # the user key is the bare one-character string, as Spark's test passes it
        if not self.by_name.containsKey(name):
            self.by_name.updateValue(name, (0, self.ATTRIBUTES, self.CONFS))
        else:
            number, attributes, confs = self.by_name.getValue(name)
            attributes[name] = [total]
            confs.setdefault("e1", {})[name] = total
            self.by_name.updateValue(name, (number, attributes, confs))
        _, attributes, confs = self.by_name.getValue(name)
        return attributes, confs

    def _composite_output(self, name, n):
        def inner(i, scale):
            return {"intValue": i * scale[0], "doubleValue": float(i * scale[1]),
                    "arrayValue": [f"elem_{i}_{j}" for j in range(i + 1)],
                    "mapValue": {f"map_{i}_{j}": f"val_{i}_{j}" for j in range(i + 1)}}

        as_struct = (lambda d: d) if self.pandas else (lambda d: Row(**d))
        return {"primitiveValue": f"key_{name}_count_{n}",
                "listOfPrimitive": [f"item_{i}" for i in range(n)],
                "mapOfPrimitive": {f"key{i}": f"value{i}" for i in range(n)},
                "listOfComposite": [as_struct(inner(i, (1, 1.5))) for i in range(n)],
                "mapOfComposite": {f"nested_key{i}": as_struct(inner(i, (10, 2.5)))
                                   for i in range(n)}}

    def handleInputRows(self, key, rows, timerValues):
        if self.pandas:
            frames = list(rows)
            total = sum(pdf["temperature"].astype(int).sum() for pdf in frames)
            n = sum(len(pdf) for pdf in frames)
        else:
            temperatures = [int(row.temperature) for row in rows]
            total, n = sum(temperatures), len(temperatures)
        name = key[0]
        ids, checks = self._value_state(total)
        flattened = self._list_state(total, ids)
        attributes, confs = self._map_state(name, total)
        n += self.count.get()[0] if self.count.exists() else 0
        self.count.update((n,))
        record = {"id": name, "value_arr": ",".join(map(str, ids)),
                  "list_state_arr": ",".join(map(str, flattened)),
                  "map_state_arr": json.dumps(attributes, default=_plain, sort_keys=True),
                  "nested_map_state_arr": json.dumps(confs, default=_plain, sort_keys=True),
                  "checks": checks}
        record.update(self._composite_output(name, n))
        yield from self._emit([record])


# --------------------------------------------------------------------------------------------
# test_transform_with_state_non_contiguous_grouping_cols
# (SimpleStatefulProcessorWithInitialState, without an initial state)

class GroupSum(_BothApis):
    """A running sum of temperatures per grouping key (one or two columns) in a value
    state; also reports the input columns the processor was handed."""

    def init(self, handle):
        self.total = handle.getValueState("value_state", _int_field("value"))

    def handleInputRows(self, key, rows, timerValues):
        total = self.total.get()[0] if self.total.exists() else 0
        seen = set()
        for item in rows:
            if self.pandas:
                total += item["temperature"].astype(int).sum()
                seen.add(",".join(item.columns))
            else:
                total += item.temperature
                seen.add(",".join(item.__fields__))
        self.total.update((total,))
        names = ("id1", "id2") if len(key) > 1 else ("id",)
        record = dict(zip(names, key))
        record.update(value=str(total), columns="|".join(sorted(seen)))
        yield from self._emit([record])


# --------------------------------------------------------------------------------------------
# test_transform_with_state_with_wmark_and_non_event_time (MinEventTimeStatefulProcessor)

class MinEventTime(_BothApis):
    """The smallest event time (seconds) seen per id, kept as a string in a value state."""

    OUTPUT = "id string, timestamp string"

    def init(self, handle):
        self.smallest = handle.getValueState(
            "min_state", StructType([StructField("value", StringType(), True)]))

    def handleInputRows(self, key, rows, timerValues):
        seconds = []
        for item in rows:
            if self.pandas:   # datetime64 as integers, at nanoseconds, as Spark's test does
                seconds += (item["eventTime"].astype("int64") // 10**9).tolist()
            else:
                seconds.append(int(item.eventTime.timestamp()))
        current = int(self.smallest.get()[0]) if self.smallest.exists() else sys.maxsize
        smallest = str(min(current, min(seconds)))
        self.smallest.update((smallest,))
        yield from self._emit([{"id": key[0], "timestamp": smallest}])


# --------------------------------------------------------------------------------------------
# test_transform_with_state_with_records_limit / _with_bytes_limit (ChunkCountProcessor)

class ChunkCount(StatefulProcessor):
    """pandas API: how many DataFrames handleInputRows was handed for the key."""

    OUTPUT = "id string, chunkCount int"

    def init(self, handle):
        """No state variables."""

    def handleInputRows(self, key, rows, timerValues):
        yield pd.DataFrame({"id": [key[0]], "chunkCount": [sum(1 for _ in rows)]})



# --------------------------------------------------------------------------------------------
# test_transform_with_state_int_to_decimal_coercion (IntToDecimalProcessor), batch query

class DecimalFromInt(StatefulProcessor):
    """pandas API: a row count in a value state, and a Python int in a decimal column."""

    def init(self, handle):
        self.count = handle.getValueState("count", _int_field("value"))

    def handleInputRows(self, key, rows, timerValues):
        n = self.count.get()[0] if self.count.exists() else 0
        n += sum(len(pdf) for pdf in rows)
        self.count.update((n,))
        yield pd.DataFrame({"id": [key[0]], "decimal_result": [12345]})



# --------------------------------------------------------------------------------------------
# errors raised by user code

FAILURE_TEXT = "scenario failure: temperature 999 is not a reading"


class FailsOnReading(_BothApis):
    """A running count per id that raises the user's own error on temperature 999."""

    OUTPUT = "id string, countAsString string"

    def init(self, handle):
        self.count = handle.getValueState("count", _int_field("value"))

    def handleInputRows(self, key, rows, timerValues):
        n = self.count.get()[0] if self.count.exists() else 0
        for chunk in self._chunks(rows, "temperature"):
            for (t,) in chunk:
                if t == 999:
                    raise ValueError(f"{FAILURE_TEXT} (id {key[0]})")
                n += 1
        self.count.update((n,))
        yield from self._emit([{"id": key[0], "countAsString": str(n)}])
