"""transformWithState's state as Spark's stores lay it out: Spark keeps each state variable
in a column family of its own (one row per value, per list element, per map entry, and per
timer in the two timer column families); arrowstate keeps one row per grouping key and
variable (layout.py). Its offline conversions to and from Spark's own store go per state
variable through Spark's `statestore` reader (arrowstate.tws_state). Needs pyarrow only.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from ... import keys as keycodec
from ...store import files as store_files
from ..spark_layout import OperatorJob, SparkLayout
from .layout import TIMER_VARIABLE, is_map_type

TIMER_FAMILIES = ("$procTimers_keyToTimestamp", "$eventTimers_keyToTimestamp")

# what the change feed of a transformWithState variable gives per record, as Spark's RocksDB
# changelog: 1 a put (Spark's "update"), 2 a merge ("append"), 0 a delete
FEED_PUT, FEED_MERGE, FEED_DELETE = 1, 2, 0


def _renamed(array: pa.StructArray, names: list[str]) -> pa.StructArray:
    """The struct with Spark's field names (arrowstate's TTL struct names its expiry
    `expiresAtMs`, Spark's `ttlExpirationMs`); nulls stay nulls."""
    return pa.StructArray.from_arrays(array.flatten(), names=names, mask=array.is_null())


def change_records(batch: pa.RecordBatch, grouping_count: int, column: int,
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


def family_rows(batch: pa.RecordBatch, grouping_count: int, values: pa.Array,
                column_family: str, grouping_names: list[str], key_schema: dict,
                value_names: list[str]) -> pa.RecordBatch:
    """A variable's stored rows (`batch`) as Spark's rows of its column family."""
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


def variable_column(schema: pa.Schema, column_family: str) -> tuple[int, int, str] | None:
    """In stored columns (`schema`, which names its value columns): the key column count,
    and the column and name of the column family's variable; None when the columns are not
    named or hold no such variable."""
    fields = list(schema)
    named = [(f.metadata or {}).get(store_files.COLUMN_NAME, b"").decode() for f in fields]
    key_count = next((i for i, n in enumerate(named) if n), len(named))
    variable = TIMER_VARIABLE if column_family in TIMER_FAMILIES else column_family
    if key_count == len(named) or f"s_{variable}" not in named[key_count:]:
        return None
    return key_count, named.index(f"s_{variable}"), variable


class TransformWithStateLayout(SparkLayout):
    family = "transformWithState"
    holds = ("the processor's state variables per grouping key (values, lists, maps, each "
             "value's TTL expiry beside it) and its timers; arrowstate keeps one row per "
             "grouping key and variable, Spark one column family per variable")
    column_families = True

    def spark_rows(self, batch: pa.RecordBatch, key_schema: dict, value_schema: dict,
                   column_family: str | None = None) -> pa.RecordBatch:
        """The rows of `column_family` among stored rows (`batch`, in the stored schema,
        which names its value columns): one per value (value state), per list element, per
        map entry (key `struct<key, userKey>`) or per timer (key `struct<key,
        expiryTimestampMs>`, for the timer column families)."""
        found = None if column_family is None else variable_column(batch.schema,
                                                                   column_family)
        if found is None:
            raise ValueError(f"arrowstate: transformWithState rows are read per column "
                             f"family; these rows have none named {column_family!r}")
        key_count, column, variable = found
        mine = batch.filter(pc.equal(batch.column(key_count - 1), variable))
        values = mine.column(column)
        grouping_names = [f["name"] for f in (
            key_schema["fields"][0]["type"] if column_family in TIMER_FAMILIES
            or is_map_type(values.type) else key_schema)["fields"]]
        return family_rows(mine, key_count - 1, values, column_family, grouping_names,
                           key_schema, [f["name"] for f in value_schema["fields"]])

    def our_rows(self, batch: pa.RecordBatch, value_schema: dict) -> pa.RecordBatch:
        # Spark's rows of one column family do not make arrowstate rows by themselves (a
        # key's row holds its variable's whole list or map, typed by the processor's
        # declaration): import_operator builds them per variable from Spark's reader
        raise ValueError("arrowstate: transformWithState state is imported per state "
                         "variable (state import), not from one store's key and value rows")

    def export_operator(self, job: OperatorJob) -> list[int]:
        from ... import tws_state
        return tws_state.export_operator(job.spark, job.checkpoint, job.state_root,
                                         job.operator_id, job.batch, job.version,
                                         job.partitions)

    def import_operator(self, job: OperatorJob) -> list[int]:
        from ... import tws_state
        return tws_state.convert_operator(job.spark, job.checkpoint, job.operator_id,
                                          job.batch, job.version, job.partitions,
                                          job.time_zone, repartition=False)

    def repartition_operator(self, job: OperatorJob) -> list[int]:
        from ... import tws_state
        return tws_state.convert_operator(job.spark, job.checkpoint, job.operator_id,
                                          job.batch, job.version, job.partitions,
                                          job.time_zone, repartition=True)


LAYOUT = TransformWithStateLayout()
