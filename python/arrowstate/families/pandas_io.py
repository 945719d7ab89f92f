"""What a family running a user's Python function shares with pyspark's own worker: the
runner conf, Arrow -> pandas columns, and the function's output frames -> one Arrow batch,
each converted exactly as pyspark converts them."""
from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa


def _spark_atomic_types() -> tuple:
    """Spark types whose pandas -> Arrow conversion in pyspark's worker is Arrow's own, from
    the column's values (pyspark's converter for them is the identity)."""
    from pyspark.sql import types as t
    return (t.LongType, t.IntegerType, t.ShortType, t.ByteType, t.DoubleType, t.FloatType,
            t.BooleanType, t.StringType, t.BinaryType)


# Arrow types whose column pyspark's worker turns into the pandas values Arrow's own
# `to_numpy` gives (numpy int64, float64 and bool; Python str in an object array; a null as
# NaN, or None in an object array), already as wide as pyspark's frames have them: columns of
# only these go to a DataFrame from those values at once (`plain_frame`)
_PLAIN_TYPES = frozenset({pa.int64(), pa.float64(), pa.bool_(), pa.string(), pa.large_string()})


def _rows_from_blocks(pd, frame, lo: int, hi: int):
    rows = frame._mgr.get_slice(slice(lo, hi), axis=1)
    rows.axes[1] = pd.RangeIndex(hi - lo)
    return pd.DataFrame._from_mgr(rows, axes=rows.axes)


class PandasIO:
    def __init__(self, operator: dict[str, Any]) -> None:
        import pandas as pd
        from pyspark.sql.conversion import ArrowBatchTransformer, PandasToArrowConversion
        from pyspark.sql.pandas.types import to_arrow_type
        from pyspark.sql.types import StructType

        self.pd = pd   # the pandas module, for the families that use this
        self._to_pandas_columns = ArrowBatchTransformer.to_pandas
        self._to_arrow = PandasToArrowConversion.convert
        conf = operator["runnerConf"]
        self.timezone = conf.get("spark.sql.session.timeZone")
        self.assign_cols_by_name = conf.get(
            "spark.sql.legacy.execution.pandas.groupedMap.assignColumnsByName", "true") == "true"
        self.safecheck = conf.get(
            "spark.sql.execution.pandas.convertToArrowArraySafely", "false") == "true"
        self.int_to_decimal = conf.get(
            "spark.sql.execution.pythonUDF.pandas.intToDecimalCoercionEnabled",
            "false") == "true"
        self.prefer_int_ext_dtype = conf.get(
            "spark.sql.execution.pythonUDF.pandas.preferIntExtensionDtype", "false") == "true"
        self.output_schema = StructType.fromJson(json.loads(operator["outputSchema"]))
        # the output's Arrow types when all are atomic (_arrow_batch), made once per task
        fields, atomic = self.output_schema.fields, _spark_atomic_types()
        self._atomic_types = [to_arrow_type(f.dataType, timezone=self.timezone)
                              for f in fields] \
            if fields and all(isinstance(f.dataType, atomic) for f in fields) else None
        self.outputs: list = []   # the function's non-empty output frames, in order

    def to_pandas(self, batch: pa.RecordBatch) -> list:
        """Columns as pandas Series, converted exactly as PySpark's worker does."""
        return self._to_pandas_columns(
            batch, timezone=self.timezone, struct_in_pandas="dict", ndarray_as_list=False,
            prefer_int_ext_dtype=self.prefer_int_ext_dtype, df_for_struct=False)

    def plain_frame(self, batch: pa.RecordBatch, indices: list[int]):
        """The columns at `indices` as one DataFrame, the one `frame_of(to_pandas(...))`
        makes, from the columns' values directly when each is of a _PLAIN_TYPES type under a
        name of its own (and pyspark's integer extension types are not asked for): 80 us
        against 300 for a small batch, where pyspark's conversion sets up each column
        apart. None otherwise."""
        names = [batch.schema.names[i] for i in indices]
        if not indices or len(set(names)) != len(names) or not self._plain(batch, indices):
            return None
        return self.pd.DataFrame({name: batch.column(i).to_numpy(zero_copy_only=False)
                                  for name, i in zip(names, indices)})

    def plain_values(self, batch: pa.RecordBatch, indices: list[int]) -> list | None:
        """The columns at `indices` as the Python values `to_pandas(...)[i].tolist()` gives,
        from Arrow directly when each is of a _PLAIN_TYPES type and has no null (pandas
        would give an integer column's null as a float NaN); None otherwise."""
        if not self._plain(batch, indices) or any(batch.column(i).null_count for i in indices):
            return None
        return [batch.column(i).to_pylist() for i in indices]

    def _plain(self, batch: pa.RecordBatch, indices: list[int]) -> bool:
        """Whether the columns at `indices` are all of _PLAIN_TYPES types, and pyspark's
        integer extension types are not asked for."""
        types = batch.schema.types
        return not self.prefer_int_ext_dtype and all(types[i] in _PLAIN_TYPES for i in indices)

    def frame_of(self, columns: list):
        """Series side by side as one DataFrame, as `pd.concat(columns, axis=1)` makes it:
        from their numpy values when each is a numpy column of a distinct string name on
        the same RangeIndex (half concat's time, which is most of a small flush's), else by
        concat."""
        pd = self.pd
        names = [c.name for c in columns]
        index = columns[0].index if columns else None
        if (columns and all(isinstance(n, str) for n in names) and len(set(names)) == len(names)
                and isinstance(index, pd.RangeIndex)
                and all(isinstance(c.dtype, np.dtype) and c.index.equals(index)
                        for c in columns)):
            return pd.DataFrame({c.name: c.to_numpy() for c in columns}, index=index)
        return pd.concat(columns, axis=1)

    def frame_rows(self, frame, lo: int, hi: int):
        """Rows lo..hi of `frame` as a DataFrame indexed from 0, as pyspark hands over a
        group's rows. Made from the frame's block manager, as pandas' own groupby cuts its
        groups: 9 us against 14 for `iloc` and a new index, and an `iloc` slice is marked a
        copy of the batch's frame, so a function assigning a column to it would get a
        SettingWithCopyWarning that pyspark's frames never give."""
        try:
            return _rows_from_blocks(self.pd, frame, lo, hi)
        except (AttributeError, TypeError):   # another pandas' internals
            chunk = frame.iloc[lo:hi].copy(deep=False)
            chunk.index = self.pd.RangeIndex(hi - lo)
            return chunk

    def _merged_columns(self, frames: list) -> list | None:
        """The output frames' columns in the output schema's order, each joined into one
        numpy array, when every frame has the first one's columns and numpy dtypes (what
        pyspark's conversion would take from them, by name or by position as it takes
        them); None when they differ."""
        names = self.output_schema.names
        first = list(frames[0].columns)
        if self.assign_cols_by_name and all(isinstance(c, str) for c in first):
            if sorted(first) != sorted(names):
                return None
            positions = [first.index(n) for n in names]
        elif len(first) == len(names):
            positions = list(range(len(names)))
        else:
            return None
        columns: list[list] = [[] for _ in positions]
        try:
            dtypes = [frames[0]._mgr.iget_values(p).dtype for p in positions]
            for frame in frames:
                if list(frame.columns) != first:
                    return None
                for parts, p, dtype in zip(columns, positions, dtypes):
                    values = frame._mgr.iget_values(p)
                    if not isinstance(values, np.ndarray) or values.dtype != dtype:
                        return None
                    parts.append(values)
        except AttributeError:   # another pandas' internals: take the general path
            return None
        return [parts[0] if len(parts) == 1 else np.concatenate(parts) for parts in columns]

    def _arrow_batch(self, columns: list) -> pa.RecordBatch | None:
        """The output columns as Arrow, by the call pyspark's conversion makes for a column
        of an atomic type (`pa.Array.from_pandas(series, mask=series.isnull(), type, safe)`,
        its converter for these types being the identity), made on the numpy values
        directly: 30 us a flush against 1 ms through pyspark's per-column set-up. None when
        the schema is not all atomic or Arrow refuses a column: pyspark's conversion then
        casts or raises, as it does."""
        if self._atomic_types is None:
            return None
        arrays = []
        for values, arrow_type in zip(columns, self._atomic_types):
            # series.isnull() is all false for numpy's integers and booleans
            mask = self.pd.isna(values) if values.dtype.kind in "fcOmM" else None
            try:
                arrays.append(pa.array(values, type=arrow_type, mask=mask, from_pandas=True,
                                       safe=self.safecheck))
            except (pa.ArrowException, TypeError, ValueError):
                return None
        return pa.RecordBatch.from_arrays(arrays, self.output_schema.names)

    def output_batch(self) -> pa.RecordBatch | None:
        """The output frames so far as one Arrow batch of the output schema (None for none),
        as pyspark's worker converts their concatenation. pd.concat costs ~25 us per frame,
        more than most state functions: frames of the same columns and numpy dtypes are
        joined by column instead."""
        if not self.outputs:
            return None
        frames, self.outputs = self.outputs, []
        columns = self._merged_columns(frames)
        if columns is not None:
            batch = self._arrow_batch(columns)
            if batch is not None:
                return batch
            merged = self.pd.DataFrame(dict(zip(self.output_schema.names, columns)))
        else:
            merged = self.pd.concat(frames, ignore_index=True)
        return self._to_arrow(
            merged, self.output_schema, timezone=self.timezone, safecheck=self.safecheck,
            arrow_cast=True, assign_cols_by_name=self.assign_cols_by_name,
            int_to_decimal_coercion_enabled=self.int_to_decimal)
