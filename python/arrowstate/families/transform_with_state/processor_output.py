"""What transformWithState's processor returns, collected and handed back as Arrow batches
of the output schema, as pyspark's worker converts it: pandas DataFrames (each checked to be
one) joined and converted by pandas_io, or the Row API's Rows.
"""
from __future__ import annotations

import pyarrow as pa

from ...spark_state.layout import arrow_fields
from ..pandas_io import PandasIO


class ProcessorOutput:
    """The processor's results since the last `batch()`. `add(result)` takes a handler's
    result (an iterator of DataFrames or Rows); `collect(result)` also takes None."""

    def __init__(self, io: PandasIO, pandas: bool) -> None:
        self._io, self._pandas = io, pandas
        self._rows: list = []         # Row API: the processor's Rows
        self._row_schema = None       # Row API: the Arrow schema pyspark's worker writes
        self.add = self._add_frames if pandas else self._rows.extend

    def collect(self, result) -> None:
        if result is not None:
            self.add(result)

    def _add_frames(self, result) -> None:
        pd, outputs = self._io.pd, self._io.outputs
        for pdf in result:
            if not isinstance(pdf, pd.DataFrame):
                from pyspark.errors import PySparkValueError
                raise PySparkValueError(
                    "Invalid return type. Please make sure that the UDF returns a "
                    "pandas.DataFrame when the specified return type is StructType.")
            if len(pdf) > 0:
                outputs.append(pdf)

    def batch(self) -> pa.RecordBatch | None:
        """The results since the last call as one Arrow batch (None for none)."""
        if self._pandas:
            return self._io.output_batch()
        if not self._rows:
            return None
        if self._row_schema is None:   # as pyspark's worker converts Rows
            self._row_schema = pa.schema(arrow_fields(self._io.output_schema, "UTC"))
        rows, self._rows = self._rows, []
        self.add = self._rows.extend
        return rows_to_arrow(rows, self._row_schema)


def rows_to_arrow(rows: list, schema: pa.Schema) -> pa.RecordBatch:
    """The processor's output Rows as pyspark's worker converts them (each row's
    asDict(recursive=True), then Arrow by field name), by column when every row is a Row of
    the schema's fields in its order and no field is nested (the same values, without a
    dict per row)."""
    names = schema.names
    flat = not any(pa.types.is_nested(t) for t in schema.types)
    if flat and all(getattr(row, "__fields__", None) == names for row in rows):
        # the rows as one struct array: one conversion call, where one per column cost a
        # real-time flush of a row twice as much (pa.array's fixed cost)
        return pa.RecordBatch.from_struct_array(pa.array(rows, pa.struct(schema)))
    return pa.RecordBatch.from_pylist([row.asDict(True) for row in rows], schema=schema)
