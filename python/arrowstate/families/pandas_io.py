"""What a family running a user's Python function shares with pyspark's own worker: the
runner conf, Arrow -> pandas columns, and the function's output frames -> one Arrow batch,
each converted exactly as pyspark converts them."""
from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa


def _rows_from_blocks(pd, frame, lo: int, hi: int):
    rows = frame._mgr.get_slice(slice(lo, hi), axis=1)
    rows.axes[1] = pd.RangeIndex(hi - lo)
    return pd.DataFrame._from_mgr(rows, axes=rows.axes)


class PandasIO:
    def __init__(self, operator: dict[str, Any]) -> None:
        import pandas as pd
        from pyspark.sql.conversion import ArrowBatchTransformer, PandasToArrowConversion
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
        self.outputs: list = []   # the function's non-empty output frames, in order

    def to_pandas(self, batch: pa.RecordBatch) -> list:
        """Columns as pandas Series, converted exactly as PySpark's worker does."""
        return self._to_pandas_columns(
            batch, timezone=self.timezone, struct_in_pandas="dict", ndarray_as_list=False,
            prefer_int_ext_dtype=self.prefer_int_ext_dtype, df_for_struct=False)

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

    def _merged_outputs(self):
        """The function's output frames as one DataFrame, as pd.concat would make it.

        pd.concat costs ~25 us per frame, more than most state functions; when every frame
        has the first one's columns and numpy dtypes, the columns are joined directly."""
        frames, pd = self.outputs, self.pd
        names = self.output_schema.names
        first = list(frames[0].columns)
        if self.assign_cols_by_name and all(isinstance(c, str) for c in first):
            if sorted(first) != sorted(names):
                return pd.concat(frames, ignore_index=True)
            positions = [first.index(n) for n in names]
        elif len(first) == len(names):
            positions = list(range(len(names)))
        else:
            return pd.concat(frames, ignore_index=True)
        columns: list[list] = [[] for _ in positions]
        try:
            dtypes = [frames[0]._mgr.iget_values(p).dtype for p in positions]
            for frame in frames:
                if list(frame.columns) != first:
                    return pd.concat(frames, ignore_index=True)
                for parts, p, dtype in zip(columns, positions, dtypes):
                    values = frame._mgr.iget_values(p)
                    if not isinstance(values, np.ndarray) or values.dtype != dtype:
                        return pd.concat(frames, ignore_index=True)
                    parts.append(values)
        except AttributeError:   # another pandas' internals: take the general path
            return pd.concat(frames, ignore_index=True)
        return pd.DataFrame({n: np.concatenate(parts) for n, parts in zip(names, columns)})

    def output_batch(self) -> pa.RecordBatch | None:
        """The output frames so far as one Arrow batch of the output schema (None for none)."""
        if not self.outputs:
            return None
        merged = self._merged_outputs()
        self.outputs = []
        return self._to_arrow(
            merged, self.output_schema, timezone=self.timezone, safecheck=self.safecheck,
            arrow_cast=True, assign_cols_by_name=self.assign_cols_by_name,
            int_to_decimal_coercion_enabled=self.int_to_decimal)
