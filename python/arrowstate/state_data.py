"""arrowstate state as Spark's state stores present it: key and value rows in the schemas
Spark records for the operator (its `_metadata/schema` files), so that Spark's own readers
(`spark.read.format("statestore")`) show arrowstate state as they show native state.

Our files hold the key columns `k0..` then the value columns `v0..` of each family:
- deduplication: no value (Spark's value is one null `__dummy__` field); within the
  watermark: `expiresAtMicros`;
- aggregation: the aggregation buffer, field for field, as Spark's value;
- applyInPandasWithState: the state fields, whether a value is defined, and the timeout
  timestamp; Spark's value is the `groupState` struct (null when undefined) and, when the
  operator has timeouts, `timeoutTimestamp`.
"""
from __future__ import annotations

import json
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from . import keys as keycodec
from .families.transform_with_state.layout import TIMER_VARIABLE, is_map_type
from .store import VersionedState
from .store import files as store_files
from .store.lifecycle import FileSource, load_plans

DUMMY = "__dummy__"
GROUP_STATE, TIMEOUT = "groupState", "timeoutTimestamp"
BATCH_ROWS = 1 << 16


def value_layout(value_schema: dict) -> str:
    names = [f["name"] for f in value_schema["fields"]]
    if names == [DUMMY]:
        return "dummy"
    if names and names[0] == GROUP_STATE and isinstance(value_schema["fields"][0]["type"], dict):
        return "groupState"
    return "fields"


def spark_rows(batch: pa.RecordBatch, key_schema: dict, value_schema: dict
               ) -> pa.RecordBatch:
    """Stored rows as two struct columns, `key` and `value`, in Spark's schemas."""
    key_count = len(key_schema["fields"])
    key_names = [f["name"] for f in key_schema["fields"]]
    values = batch.columns[key_count:]
    n = batch.num_rows
    layout = value_layout(value_schema)
    value_names = [f["name"] for f in value_schema["fields"]]
    if layout == "dummy":
        value = pa.StructArray.from_arrays([pa.nulls(n, pa.null())], names=[DUMMY])
    elif layout == "groupState":
        state_names = [f["name"] for f in value_schema["fields"][0]["type"]["fields"]]
        width = len(state_names)
        defined = pc.fill_null(values[width], False)   # null in a removal record
        group = pa.StructArray.from_arrays(values[:width], names=state_names,
                                           mask=pc.invert(defined))
        columns, names = [group], [GROUP_STATE]
        if TIMEOUT in value_names:
            columns.append(values[width + 1])
            names.append(TIMEOUT)
        value = pa.StructArray.from_arrays(columns, names=names)
    else:
        if len(values) != len(value_names):
            raise ValueError(f"arrowstate holds {len(values)} value columns, but Spark's "
                             f"value schema has {len(value_names)} ({value_names})")
        value = pa.StructArray.from_arrays(values, names=value_names)
    key = pa.StructArray.from_arrays(batch.columns[:key_count], names=key_names)
    return pa.RecordBatch.from_arrays([key, value], names=["key", "value"])


def stored_schema(source: FileSource, version: int) -> pa.Schema | None:
    """The state columns of the files that load `version` (None at version 0): the newest
    file's (a family that names its columns may have added some since the oldest)."""
    if version == 0:
        return None
    plans, _ = load_plans(source.names(), version, source.where, source.context)
    chain = plans[0][0]
    payload = source.read(chain[-1])
    if store_files.unique_id(payload) is not None:
        payload = payload[:-store_files.TRAILER.size]
    try:
        schema = pa.ipc.open_stream(pa.py_buffer(payload)).schema
    except pa.ArrowException as e:
        raise store_files.CorruptStateFile(f"{source.where}/{chain[-1]}", source.context,
                                           f"its Arrow data is invalid: {e}") from e
    return pa.schema(list(schema)[:-1])


def stored_state(source: FileSource, version: int) -> VersionedState | None:
    """An empty state in the columns of the files that load `version` (None at version 0):
    the key columns (`k0..`), then the value columns (`v0..`), by name when the files name
    them."""
    schema = stored_schema(source, version)
    if schema is None:
        return None
    fields = list(schema)
    names = [(f.metadata or {}).get(store_files.COLUMN_NAME) for f in fields]
    if any(names):
        key_count = names.index(next(n for n in names if n))
        values = [pa.field(n.decode(), f.type) for n, f in zip(names[key_count:],
                                                                fields[key_count:])]
        return VersionedState(fields[:key_count], values, named_columns=True)
    key_count = sum(1 for f in fields if f.name.startswith("k"))
    return VersionedState(fields[:key_count], fields[key_count:])


def read_state(source: FileSource, version: int, key_schema_json: str,
               value_schema_json: str, snapshot: int | None = None
               ) -> Iterator[pa.RecordBatch]:
    """Every live row of `version`, in Spark's key and value layout, verified as a task's
    load verifies it; with `snapshot`, loaded from that snapshot and the deltas after it."""
    key_schema, value_schema = json.loads(key_schema_json), json.loads(value_schema_json)
    state = stored_state(source, version)
    if state is None:
        return
    state.load(source, version, snapshot)
    for batch in state.rows.frozen().batches(BATCH_ROWS):
        yield spark_rows(batch, key_schema, value_schema)


def read_changes(source: FileSource, start: int, end: int, key_schema_json: str,
                 value_schema_json: str) -> Iterator[pa.RecordBatch]:
    """The puts and removes of versions start..end, in order, as Spark's change data readers
    give them: `key`, `value` (null for a remove), `op` (1 put, 0 remove), `version`."""
    key_schema, value_schema = json.loads(key_schema_json), json.loads(value_schema_json)
    names = set(source.names())
    schema = stored_schema(source, end)
    if schema is None:
        return
    for version in range(start, end + 1):
        name = store_files.file_name(store_files.DELTA, version)
        if name not in names:
            raise _missing_delta(source, name, start)
        batches, _ = store_files.decode(f"{source.where}/{name}", source.context,
                                        source.read(name), schema)
        for batch in batches:
            for op, run in store_files.op_runs(batch):
                if op not in (store_files.OP_PUT, store_files.OP_REMOVE):
                    continue
                rows = spark_rows(pa.RecordBatch.from_arrays(run.columns[:-1],
                                                             schema=schema),
                                  key_schema, value_schema)
                value = rows.column(1)
                if op == store_files.OP_REMOVE:
                    value = pa.nulls(len(value), value.type)
                yield pa.RecordBatch.from_arrays(
                    [rows.column(0), value, pa.array([op] * len(value), pa.int8()),
                     pa.array([version] * len(value), pa.int64())],
                    names=["key", "value", "op", "version"])


def _missing_delta(source: FileSource, name: str, start: int) -> Exception:
    return store_files.CorruptStateFile(
        f"{source.where}/{name}", source.context,
        f"the change feed from version {start} needs it, and it does not exist (retention "
        f"removed it, or the state never reached that version)",
        condition="CANNOT_LOAD_STATE_STORE.CANNOT_READ_DELTA_FILE_NOT_EXISTS")


# transformWithState: Spark keeps each state variable in a column family of its own;
# arrowstate keeps one row per grouping key and variable (see families/transform_with_state/layout)
TIMER_FAMILIES = ("$procTimers_keyToTimestamp", "$eventTimers_keyToTimestamp")


def _renamed(array: pa.StructArray, names: list[str]) -> pa.StructArray:
    """The struct with Spark's field names (arrowstate's TTL struct names its expiry
    `expiresAtMs`, Spark's `ttlExpirationMs`); nulls stay nulls."""
    return pa.StructArray.from_arrays(array.flatten(), names=names, mask=array.is_null())


def _variable_column(source: FileSource, state: VersionedState, column_family: str
                     ) -> tuple[int, int, str]:
    """The state's key column count, and the column and name of the column family's
    variable."""
    key_count, fields = state.key_count, list(state.schema)
    named = [(f.metadata or {}).get(store_files.COLUMN_NAME, b"").decode()
             for f in fields[key_count:]]
    if not all(named):
        raise ValueError(f"arrowstate: {source.where} ({source.context}) holds no "
                         f"transformWithState state: it has no column family {column_family}")
    variable = TIMER_VARIABLE if column_family in TIMER_FAMILIES else column_family
    if f"s_{variable}" not in named:
        raise ValueError(f"arrowstate: the transformWithState state in {source.where} "
                         f"({source.context}) has no state variable {variable!r}; it has "
                         f"{sorted(n[2:] for n in named)}")
    return key_count, key_count + named.index(f"s_{variable}"), variable


def read_column_family(source: FileSource, version: int, column_family: str,
                       key_schema_json: str, value_schema_json: str,
                       snapshot: int | None = None) -> Iterator[pa.RecordBatch]:
    """A transformWithState variable of `version` as Spark's column family of it holds it:
    one row per value (value state), per list element (rows of a key one after another),
    per map entry (key `struct<key, userKey>`) or per timer (key `struct<key,
    expiryTimestampMs>`, for the timer column families)."""
    key_schema, value_schema = json.loads(key_schema_json), json.loads(value_schema_json)
    state = stored_state(source, version)
    if state is None:
        return
    key_count, column, variable = _variable_column(source, state, column_family)
    fields = list(state.schema)
    state.load(source, version, snapshot)
    grouping_names = [f["name"] for f in (
        key_schema["fields"][0]["type"] if column_family in TIMER_FAMILIES
        or is_map_type(fields[column].type) else key_schema)["fields"]]
    value_names = [f["name"] for f in value_schema["fields"]]
    for batch in state.rows.frozen().batches(BATCH_ROWS):
        mine = batch.filter(pc.equal(batch.column(key_count - 1), variable))
        if mine.num_rows:
            yield _family_rows(mine, key_count - 1, mine.column(column), column_family,
                               grouping_names, key_schema, value_names)


# what the change feed of a transformWithState variable gives per record, as Spark's RocksDB
# changelog: 1 a put (Spark's "update"), 2 a merge ("append"), 0 a delete
FEED_PUT, FEED_MERGE, FEED_DELETE = 1, 2, 0


def read_column_family_changes(source: FileSource, start: int, end: int,
                               column_family: str, key_schema_json: str,
                               value_schema_json: str) -> Iterator[pa.RecordBatch]:
    """Spark's change feed of a transformWithState variable over versions start..end: a
    record per state operation, from the change records of each delta (store.files); a key
    whose put or remove row has none changed by that one write (a value or list put, a
    remove a delete; deltas before change records: a map's put row its entries' updates).
    Columns `key`, `value` (null for a delete) in the family's schemas, `op` (FEED_*) and
    `version`."""
    if column_family in TIMER_FAMILIES:
        raise ValueError(f"arrowstate: the change feed of timers ({source.where}, "
                         f"{source.context}) is not readable; read registered timers at "
                         f"each batchId instead")
    key_schema, value_schema = json.loads(key_schema_json), json.loads(value_schema_json)
    state = stored_state(source, end)
    if state is None:
        return
    key_count, column, variable = _variable_column(source, state, column_family)
    names = set(source.names())
    value_names = [f["name"] for f in value_schema["fields"]]
    for version in range(start, end + 1):
        name = store_files.file_name(store_files.DELTA, version)
        if name not in names:
            raise _missing_delta(source, name, start)
        batches, _ = store_files.decode(f"{source.where}/{name}", source.context,
                                        source.read(name), state.schema,
                                        state.dropped_columns)
        # a key's change records and its rows are in batches of their own
        mine = [b.filter(pc.equal(b.column(key_count - 1), variable)) for b in batches]
        mine = [b for b in mine if b.num_rows]
        if mine:
            yield _change_records(pa.concat_batches(mine), key_count - 1, column, key_schema,
                                  value_names, version)


def _change_records(batch: pa.RecordBatch, grouping_count: int, column: int,
                    key_schema: dict, value_names: list[str], version: int
                    ) -> pa.RecordBatch:
    """One delta's rows of a variable as change feed records, per key in order."""
    ops = batch.column(batch.num_columns - 1).to_pylist()
    groups = keycodec.rows(batch.columns[:grouping_count], batch.num_rows)
    with_records = {g for g, op in zip(groups, ops) if op > store_files.OP_PUT}
    values = batch.column(column)
    is_list = pa.types.is_list(values.type)
    is_map = is_map_type(values.type)
    lengths = (pc.fill_null(pc.list_value_length(values), 0).to_pylist() if is_list
               else None)
    offsets = values.offsets.to_pylist() if is_list else None
    # per record: its row, the element it shows (an index into the list's elements, or
    # the row's value), its feed op
    rows, elements, feed = [], [], []
    for i, (group, op) in enumerate(zip(groups, ops)):
        if (op > store_files.OP_PUT) != (group in with_records):
            continue   # a key with change records: its rows are the state they led to
        if op in (store_files.OP_REMOVE, store_files.CHANGE_DELETE) and not is_map:
            rows.append(i)
            elements.append(None)
            feed.append(FEED_DELETE)
        elif not is_list:
            rows.append(i)
            elements.append(i)
            feed.append(FEED_PUT)
        else:
            for j in range(lengths[i]):
                rows.append(i)
                elements.append(offsets[i] + j)
                if is_map:
                    feed.append(FEED_DELETE if op == store_files.CHANGE_DELETE else FEED_PUT)
                else:
                    feed.append(FEED_PUT if j == 0 and op != store_files.CHANGE_APPEND
                                else FEED_MERGE)
    take_rows = pa.array(rows, pa.int32())
    picked = pa.array(elements, pa.int32())
    grouping_names = [f["name"] for f in (key_schema["fields"][0]["type"] if is_map
                                          else key_schema)["fields"]]
    grouping = pa.StructArray.from_arrays(
        [c.take(take_rows) for c in batch.columns[:grouping_count]], names=grouping_names)
    if is_map:
        entries = values.flatten().take(picked)
        user_key, value = entries.flatten()
        key = pa.StructArray.from_arrays([grouping, user_key],
                                         names=[f["name"] for f in key_schema["fields"]])
    else:
        key, value = grouping, (values.flatten() if is_list else values).take(picked)
    return pa.RecordBatch.from_arrays(
        [key, _renamed(value, value_names), pa.array(feed, pa.int8()),
         pa.array([version] * len(feed), pa.int64())], names=["key", "value", "op", "version"])


def _family_rows(batch: pa.RecordBatch, grouping_count: int, values: pa.Array,
                 column_family: str, grouping_names: list[str], key_schema: dict,
                 value_names: list[str]) -> pa.RecordBatch:
    grouping = pa.StructArray.from_arrays(batch.columns[:grouping_count], names=grouping_names)
    if not pa.types.is_list(values.type):   # a value
        return pa.RecordBatch.from_arrays([grouping, _renamed(values, value_names)],
                                          names=["key", "value"])
    owner = pc.list_parent_indices(values)
    grouping, elements = grouping.take(owner), values.flatten()
    outer = [f["name"] for f in key_schema["fields"]]
    if column_family in TIMER_FAMILIES:
        key = pa.StructArray.from_arrays([grouping, elements], names=outer)
        value = pa.StructArray.from_arrays(
            [pa.nulls(len(elements), pa.null()) for _ in value_names], names=value_names)
    elif is_map_type(values.type):
        user_key, value = elements.flatten()
        key = pa.StructArray.from_arrays([grouping, user_key], names=outer)
        value = _renamed(value, value_names)
    else:
        key, value = grouping, _renamed(elements, value_names)
    return pa.RecordBatch.from_arrays([key, value], names=["key", "value"])
