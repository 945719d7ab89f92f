"""Deduplication's state as Spark's stores lay it out: the key columns as Spark's key row;
no value (Spark's value is one null `__dummy__` field), or within the watermark the key's
expiry, `expiresAtMicros`, as Spark's one value field."""
from __future__ import annotations

import pyarrow as pa

from .layout import KeyValueLayout, fields_value

DUMMY = "__dummy__"


def is_dummy(value_schema: dict) -> bool:
    """Spark's value of plain deduplication: one null field."""
    return [f["name"] for f in value_schema["fields"]] == [DUMMY]


class DeduplicateLayout(KeyValueLayout):
    family = "deduplicate"
    holds = ("one row per distinct key (the dropDuplicates columns); no value, or with "
             "dropDuplicatesWithinWatermark the time until which the key is kept")

    def spark_value(self, values: list[pa.Array], n: int, value_schema: dict
                    ) -> pa.StructArray:
        if is_dummy(value_schema):
            return pa.StructArray.from_arrays([pa.nulls(n, pa.null())], names=[DUMMY])
        return fields_value(values, value_schema)

    def our_values(self, value: pa.StructArray, n: int, value_schema: dict
                   ) -> list[pa.Array]:
        return [] if is_dummy(value_schema) else list(value.flatten())


LAYOUT = DeduplicateLayout()
