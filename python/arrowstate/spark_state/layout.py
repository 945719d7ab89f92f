"""What a family's layout object is (`SparkLayout`): its rows as Spark's stores lay them out
(its layout), to and from arrowstate's, for the offline tools (Spark's state readers through
READ_STATE, IMPORT_STATE, `python -m arrowstate state export|import|repartition|describe`).

arrowstate's files hold the key columns `k0..` then the value columns `v0..` of a family
(transformWithState names its value columns, one per state variable). Spark's stores hold
a `key` and a `value` row in the schemas it records for the operator (its `_metadata/schema`
file), or, for transformWithState, one column family per state variable.

This module and the layouts need pyarrow and numpy only (and pyspark, deferred, for
`arrow_fields`: Spark's types as Arrow's, which the live families use for their columns
too): the offline tools import them without the live families.
"""
from __future__ import annotations

import abc
import json
import os
from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow as pa

from .checkpoint_files import read_state_schema_file


@dataclass
class OperatorJob:
    """One operator's conversion by `state export`, `import` or `repartition`: the session
    and Spark's StateConversion (py4j), the checkpoint, the operator as `describe` gives it,
    the last committed batch, the version written, the partitions written, the offset log's
    settings and the session time zone (None for export, which writes Spark's rows)."""
    spark: Any
    conversion: Any
    checkpoint: str
    state_root: str
    operator: dict
    batch: int
    version: int
    partitions: int
    conf: dict
    time_zone: str | None

    @property
    def operator_id(self) -> int:
        return self.operator["operator_id"]


PROVIDER_SETTING = "spark.sql.streaming.stateStore.providerClass"
HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


class SparkLayout(abc.ABC):
    """A family's rows as Spark's stores lay them out, to and from arrowstate's. One object
    per family (`layouts.LAYOUTS`); every operation below is the family's own."""

    family: ClassVar[str]
    # what the family's state holds, in a sentence (`state describe` prints it)
    holds: ClassVar[str]
    # Spark keeps the family's state in column families of its own (one per state variable),
    # not in one default store of key and value rows
    column_families: ClassVar[bool] = False

    @abc.abstractmethod
    def spark_rows(self, batch: pa.RecordBatch, key_schema: dict, value_schema: dict,
                   column_family: str | None = None) -> pa.RecordBatch:
        """Stored rows as Spark's: two struct columns, `key` and `value`, in Spark's schemas
        (Spark's JSON); for families in column families, the rows of `column_family`."""

    @abc.abstractmethod
    def our_rows(self, batch: pa.RecordBatch, value_schema: dict) -> pa.RecordBatch:
        """Spark's `key` and `value` struct columns as the family's stored columns."""

    @abc.abstractmethod
    def export_operator(self, job: OperatorJob) -> list[int]:
        """Writes `job.version` of the operator's arrowstate state in the format of Spark's
        provider the checkpoint records; the rows per partition."""

    @abc.abstractmethod
    def import_operator(self, job: OperatorJob) -> list[int]:
        """Writes `job.version` of the operator's Spark state as arrowstate snapshots; the
        rows per partition."""

    @abc.abstractmethod
    def repartition_operator(self, job: OperatorJob) -> list[int]:
        """Writes `job.version` as `job.partitions` arrowstate snapshots of the rows of batch
        `job.batch`, each where the operator's partitioning puts it; the rows per
        partition."""


class KeyValueLayout(SparkLayout):
    """A family whose Spark state is one default store of key and value rows: converted by
    the shim's StateConversion, partition by partition, in the schemas of the operator's
    `_metadata/schema` file; Spark's key rows are arrowstate's key columns one for one."""

    def spark_rows(self, batch: pa.RecordBatch, key_schema: dict, value_schema: dict,
                   column_family: str | None = None) -> pa.RecordBatch:
        key_count = len(key_schema["fields"])
        value = self.spark_value(batch.columns[key_count:], batch.num_rows, value_schema)
        key = pa.StructArray.from_arrays(batch.columns[:key_count],
                                         names=[f["name"] for f in key_schema["fields"]])
        return pa.RecordBatch.from_arrays([key, value], names=["key", "value"])

    def our_rows(self, batch: pa.RecordBatch, value_schema: dict) -> pa.RecordBatch:
        keys = list(batch.column(0).flatten())
        values = self.our_values(batch.column(1), len(batch), value_schema)
        names = ([f"k{i}" for i in range(len(keys))] +
                 [f"v{i}" for i in range(len(values))])
        return pa.RecordBatch.from_arrays(keys + values, names=names)

    def spark_value(self, values: list[pa.Array], n: int, value_schema: dict
                    ) -> pa.StructArray:
        """The stored value columns as Spark's value struct: field for field."""
        return fields_value(values, value_schema)

    def our_values(self, value: pa.StructArray, n: int, value_schema: dict
                   ) -> list[pa.Array]:
        """Spark's value struct as the stored value columns: field for field."""
        return list(value.flatten())

    @staticmethod
    def schemas(job: OperatorJob) -> tuple[str, str]:
        """The operator's key and value schemas (Spark's JSON) from its state schema file."""
        return tuple(map(json.dumps, read_state_schema_file(os.path.join(
            job.state_root, str(job.operator_id), "0", "_metadata", "schema"))))

    def export_operator(self, job: OperatorJob) -> list[int]:
        key, value = self.schemas(job)
        return job.conversion.convertOperator(
            "export", job.spark._jsparkSession, job.state_root, job.operator_id,
            job.partitions, job.version, key, value,
            job.conf.get(PROVIDER_SETTING, HDFS_PROVIDER), "UTC")   # Spark's rows: no zone

    def import_operator(self, job: OperatorJob) -> list[int]:
        key, value = self.schemas(job)
        return job.conversion.convertOperator(
            "import", job.spark._jsparkSession, job.state_root, job.operator_id,
            job.partitions, job.version, key, value,
            job.conf.get(PROVIDER_SETTING, HDFS_PROVIDER), job.time_zone)

    def repartition_operator(self, job: OperatorJob) -> list[int]:
        # the rows through Spark's statestore reader (arrowstate's provider answers it);
        # the shim places them where the operator's partitioning does
        key, value = self.schemas(job)
        rows = (job.spark.read.format("statestore").option("batchId", job.batch)
                .option("operatorId", job.operator_id).load(job.checkpoint))
        return list(job.conversion.repartitionOperator(
            job.spark._jsparkSession, rows._jdf, job.state_root, job.operator_id,
            job.partitions, job.version, key, value, job.time_zone))


def arrow_fields(schema, timezone: str) -> list[pa.Field]:
    """The Arrow fields of a Spark struct's fields as Spark's own Arrow conversion makes them
    (the JVM's and pyspark's alike): a name a struct repeats is carried as name_0, name_1,
    ... (pyspark's Row conversion reads it so). Top-level fields are nullable, as stored."""
    from pyspark.sql.pandas.types import _deduplicate_field_names, to_arrow_type

    return [pa.field(f.name, f.type)
            for f in to_arrow_type(_deduplicate_field_names(schema), timezone=timezone)]


def fields_value(values: list[pa.Array], value_schema: dict) -> pa.StructArray:
    """Stored value columns as Spark's value struct, one field each."""
    names = [f["name"] for f in value_schema["fields"]]
    if len(values) != len(names):
        raise ValueError(f"arrowstate holds {len(values)} value columns, but Spark's "
                         f"value schema has {len(names)} ({names})")
    return pa.StructArray.from_arrays(values, names=names)
