"""transformWithState's state in Spark's layout, and arrowstate's own rows of it.

arrowstate's rows: one per grouping key and state variable: the grouping key columns and
`__state` (the variable's name) as key; one typed value column per variable (a struct for
a value, a list of structs for a list, a list of key/value structs for a map), null in the
other variables' rows. A key's timers are one more such variable, `$timers` (its sorted
expiry times), in time modes that have timers. The files name the value columns, so a
processor may add variables between runs. The live family (families.transform_with_state)
keeps its rows so, with these names.

Spark's layout: each state variable in a column family of its own (one row per value, per
list element, per map entry, and per timer in the two timer column families). The offline
conversions to and from Spark's own store (`state import`, `export`, `repartition`) go per
state variable through Spark's `statestore` reader, which reads both engines' state the
same: each variable's rows (and the registered timers) of the newest committed batch
become arrowstate snapshots, one per partition: the partition the rows were read from
(import), or the one Spark's hash partitioning of the grouping key gives (repartition).
"""
from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.compute as pc

from .. import keys as keycodec
from ..store.versions.versioned import VersionedState
from ..store.formats import encoding, names as file_names
from ..store.formats import files as store_files
from .checkpoint_files import read_column_family_schemas
from .filesystems import files_for
from .layout import OperatorJob, SparkLayout, arrow_fields

STATE_NAME = "__state"
TIMER_VARIABLE = "$timers"   # "$" names are Spark's own column families, never a processor's


def is_map_type(t: pa.DataType) -> bool:
    """A map variable's column: a list of key/value structs."""
    return (pa.types.is_list(t) and pa.types.is_struct(t.value_type)
            and [f.name for f in t.value_type] == ["key", "value"])


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


TIMER_FIELD = "expiration_timestamp_ms"


def operator_properties(op_dir: str, batch: int) -> dict:
    """The operator's properties (time mode, state variables) from the newest operator
    metadata v2 entry at or before `batch`."""
    files = files_for(op_dir)
    meta = os.path.join(op_dir, "_metadata", "v2")
    written = sorted(int(n) for n in files.listdir(meta) if n.isdigit() and int(n) <= batch) \
        if files.isdir(meta) else []
    if not written:
        raise ValueError(f"{meta}: no operator metadata (v2) for batch {batch}; "
                         "transformWithState state cannot be converted without it")
    lines = files.read_text(os.path.join(meta, str(written[-1]))).splitlines()
    return json.loads(json.loads(lines[1])["operatorPropertiesJson"])


KINDS = {"ValueState": "value", "ListState": "list", "MapState": "map"}


def describe_variables(op_dir: str, info: dict) -> tuple[list[dict], dict | None]:
    """What `state describe` says of a transformWithState operator, from its newest
    operator metadata (`info`) and the state schema (v3) file it names: each state variable
    (name, kind, schema of its values, a map's key schema, whether it has a TTL) and the
    timers (the time mode and what a timer is; None in NoTime mode). Schemas are None when
    the state schema file is not there (simpleString otherwise)."""
    from pyspark.sql.types import StructType

    def simple(schema: dict | None) -> str | None:
        return None if schema is None else StructType.fromJson(schema).simpleString()

    props = json.loads(info.get("operatorPropertiesJson", "{}"))
    families: dict = {}
    for store in info.get("stateStoreInfo", []):
        for path in store.get("stateSchemaFilePaths", [])[-1:]:   # newest: by the checkpoint
            here = os.path.join(op_dir, "_stateSchema", store["storeName"],
                                os.path.basename(path))
            if files_for(here).exists(here):
                families.update(read_column_family_schemas(here))
    variables = []
    for var in _user_variables(props):
        key, value = families.get(var["stateName"], (None, None))
        fields = {f["name"]: f["type"] for f in (value or {}).get("fields", [])}
        if var["ttlEnabled"] and "ttlExpirationMs" in fields:   # Spark's TTL wrapper
            value = fields["value"]
        kind = KINDS.get(var["stateVariableType"], var["stateVariableType"])
        entry = {"name": var["stateName"], "kind": kind, "schema": simple(value),
                 "ttl": bool(var["ttlEnabled"])}
        if kind == "map":
            user_key = {f["name"]: f["type"] for f in (key or {}).get("fields", [])}
            entry["key_schema"] = simple(user_key.get("userKey"))
        variables.append(entry)
    mode = props.get("timeMode", "NoTime")
    timers = None if mode == "NoTime" else {
        "time_mode": mode, "schema": "expiryTimestampMs bigint per grouping key, "
        + ("fired at the batch's processing time" if mode == "ProcessingTime"
           else "fired at the event-time watermark")}
    return variables, timers


def _user_variables(props: dict) -> list[dict]:
    """The processor's state variables (the timers are listed among them too)."""
    return [v for v in props["stateVariables"] if v["stateVariableType"] != "TimerState"]


def _reader(spark, checkpoint: str, operator: int, batch: int, **options):
    reader = (spark.read.format("statestore").option("batchId", batch)
              .option("operatorId", operator))
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(checkpoint)


def _partitioned(df, partitions: int | None):
    """With `partitions`, the rows' partition_id is the one the query's hash partitioning
    of the grouping key gives for that many partitions (Spark's pmod(murmur3 hash))."""
    if partitions is None:
        return df
    from pyspark.sql import functions as F
    key_fields = df.schema["key"].dataType.names
    return df.withColumn("partition_id", F.pmod(
        F.hash(*[F.col("key").getField(n) for n in key_fields]), F.lit(partitions)))


class _Builder:
    """Arrow columns in the types the family keeps, from the state reader's columns."""

    def __init__(self, time_zone: str) -> None:
        self.time_zone = time_zone

    def struct(self, spark_type) -> pa.DataType:
        return pa.struct(arrow_fields(spark_type, self.time_zone))

    def element(self, spark_type, ttl: bool) -> pa.DataType:
        """A stored element: the value, or with a TTL struct<value, expiresAtMs>."""
        if not ttl:
            return self.struct(spark_type)
        value = self.struct(spark_type["value"].dataType)
        return pa.struct([pa.field("value", value), pa.field("expiresAtMs", pa.int64())])

    def elements(self, array: pa.Array, element_type: pa.DataType, ttl: bool) -> pa.Array:
        if not ttl:
            return array.cast(element_type)
        value, expiry = array.flatten()
        return pa.StructArray.from_arrays([value.cast(element_type.field(0).type),
                                           expiry.cast(pa.int64())],
                                          fields=list(element_type))


def _stored_column(builder: _Builder, kind: str, ttl: bool, df, table: pa.Table
                     ) -> tuple[pa.DataType, pa.Array]:
    """The variable's type in arrowstate's rows and its column for the table's rows."""
    if kind == "ValueState":
        t = builder.element(df.schema["value"].dataType, ttl)
        return t, builder.elements(table.column("value").combine_chunks(), t, ttl)
    if kind == "ListState":
        element = builder.element(df.schema["list_value"].dataType.elementType, ttl)
        lists = table.column("list_value").combine_chunks()
        t = pa.list_(element)
        return t, pa.ListArray.from_arrays(lists.offsets, builder.elements(
            lists.flatten(), element, ttl), type=t)
    if kind == "MapState":
        map_type = df.schema["map_value"].dataType
        user_key = builder.struct(map_type.keyType)
        value = builder.element(map_type.valueType, ttl)
        t = pa.list_(pa.struct([pa.field("key", user_key), pa.field("value", value)]))
        maps = table.column("map_value").combine_chunks()
        entries = pa.StructArray.from_arrays(
            [maps.keys.cast(user_key), builder.elements(maps.items, value, ttl)],
            fields=list(t.value_type))
        return t, pa.ListArray.from_arrays(maps.offsets, entries, type=t)
    raise ValueError(f"arrowstate: state variable type {kind} is not one arrowstate keeps")


def _timers_column(table: pa.Table) -> tuple[pa.Table, pa.Array]:
    """One row per grouping key with its timers' expiry times, sorted."""
    keys = table.column("key").combine_chunks()
    names = [f"g{i}" for i in range(keys.type.num_fields)]
    flat = pa.table(list(keys.flatten()) + [table.column(TIMER_FIELD),
                                            table.column("partition_id")],
                    names=names + [TIMER_FIELD, "partition_id"])
    flat = flat.sort_by([(n, "ascending") for n in names] + [(TIMER_FIELD, "ascending")])
    grouped = flat.group_by(names + ["partition_id"], use_threads=False).aggregate(
        [(TIMER_FIELD, "list")])
    key = pa.StructArray.from_arrays([grouped.column(n).combine_chunks() for n in names],
                                     fields=list(keys.type))
    rows = pa.table({"key": key, "partition_id": grouped.column("partition_id")})
    times = grouped.column(f"{TIMER_FIELD}_list").combine_chunks()
    return rows, pa.ListArray.from_arrays(times.offsets, times.flatten().cast(pa.int64()))


def convert_operator(spark, checkpoint: str, operator: int, batch: int, version: int,
                     partitions: int, time_zone: str, repartition: bool) -> list[int]:
    """Writes `version` of every partition of one transformWithState operator as arrowstate
    snapshots of the state at `batch` (`partitions` of them; with `repartition`, rows go to
    the partition of their grouping key); the rows per partition."""
    op_dir = os.path.join(checkpoint, "state", str(operator))
    props = operator_properties(op_dir, batch)
    builder = _Builder(time_zone)
    to = partitions if repartition else None
    parts: list[tuple[str, pa.Table, pa.DataType, pa.Array]] = []
    grouping = None   # the grouping key's Spark type: every read's `key`
    for var in _user_variables(props):
        name, kind, ttl = var["stateName"], var["stateVariableType"], var["ttlEnabled"]
        df = _partitioned(_reader(spark, checkpoint, operator, batch, stateVarName=name,
                                  flattenCollectionTypes="false"), to)
        table = df.toArrow()
        t, column = _stored_column(builder, kind, ttl, df, table)
        parts.append((name, table.select(["key", "partition_id"]), t, column))
        grouping = df.schema["key"].dataType
    if props.get("timeMode", "NoTime") != "NoTime":
        df = _partitioned(_reader(spark, checkpoint, operator, batch,
                                  readRegisteredTimers="true"), to)
        rows, column = _timers_column(df.toArrow())
        parts.append((TIMER_VARIABLE, rows, column.type, column))
        grouping = df.schema["key"].dataType
    parts.sort(key=lambda p: p[0])   # the family's column order: its variables, sorted
    key_type = builder.struct(grouping)
    key_fields = list(key_type) + [pa.field(STATE_NAME, pa.string())]
    schema = VersionedState(key_fields, [pa.field(f"s_{n}", t) for n, _, t, _ in parts],
                            named_columns=True).schema
    counts = []
    for partition in range(partitions):
        batches = []
        for i, (name, rows, _, column) in enumerate(parts):
            mine = pc.equal(rows.column("partition_id").combine_chunks(), partition)
            n = pc.sum(mine).as_py() or 0
            if not n:
                continue
            keys = rows.column("key").combine_chunks().filter(mine)
            values = [column.filter(mine) if j == i
                      else pa.nulls(n, schema.field(len(key_fields) + j).type)
                      for j in range(len(parts))]
            key_columns = [c.cast(f.type) for c, f in zip(keys.flatten(), key_type)]
            batches.append(pa.RecordBatch.from_arrays(
                key_columns + [pa.array([name] * n, pa.string())] + values, schema=schema))
        counts.append(sum(b.num_rows for b in batches))
        if not batches:
            batches.append(pa.RecordBatch.from_pylist([], schema=schema))
        data, _ = encoding.encode(schema, file_names.SNAPSHOT, version, (
            store_files.with_op(b, store_files.OP_PUT) for b in batches))
        path = os.path.join(op_dir, str(partition),
                            file_names.file_name(file_names.SNAPSHOT, version))
        files_for(path).write_atomic(path, data)
    return counts


def export_operator(spark, checkpoint: str, state_root: str, operator: int, batch: int,
                    version: int, partitions: int) -> list[int]:
    """Writes `version` of every partition of one transformWithState operator into Spark's
    RocksDB store from arrowstate's state at `batch`; the rows (values, list elements, map
    entries, timers) per partition."""
    props = operator_properties(os.path.join(state_root, str(operator)), batch)
    names, kinds, ttls, frames = [], [], [], []
    for var in _user_variables(props):
        names.append(var["stateName"])
        kinds.append(var["stateVariableType"])
        ttls.append(bool(var["ttlEnabled"]))
        frames.append(_reader(spark, checkpoint, operator, batch, stateVarName=var["stateName"],
                              flattenCollectionTypes="true")._jdf)
    time_mode = props.get("timeMode", "NoTime")
    if time_mode != "NoTime":
        names.append(TIMER_VARIABLE)
        kinds.append("Timers")
        ttls.append(False)
        frames.append(_reader(spark, checkpoint, operator, batch,
                              readRegisteredTimers="true")._jdf)
    export = spark._jvm.org.apache.spark.sql.arrowstate.tools.TransformWithStateExport
    return list(export.exportOperator(spark._jsparkSession, state_root, operator, partitions,
                                      version, names, kinds, ttls, frames, time_mode))


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
        return export_operator(job.spark, job.checkpoint, job.state_root, job.operator_id,
                               job.batch, job.version, job.partitions)

    def import_operator(self, job: OperatorJob) -> list[int]:
        return convert_operator(job.spark, job.checkpoint, job.operator_id, job.batch,
                                job.version, job.partitions, job.time_zone,
                                repartition=False)

    def repartition_operator(self, job: OperatorJob) -> list[int]:
        return convert_operator(job.spark, job.checkpoint, job.operator_id, job.batch,
                                job.version, job.partitions, job.time_zone,
                                repartition=True)


LAYOUT = TransformWithStateLayout()
