"""transformWithState's input, cut as pyspark's worker cuts it for the processor: rows
arrive sorted by grouping key, and each key's rows are handed over as DataFrames of at
most maxRecordsPerBatch rows (pandas) or as Rows (Row API).
"""
from __future__ import annotations

import math
from typing import Any, Iterator

import pyarrow as pa

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


class ProcessorInput:
    """A batch's rows per grouping key, as the processor gets them."""

    def __init__(self, operator: dict[str, Any], io: PandasIO, row_class: type) -> None:
        self.io, self._Row = io, row_class
        self.pandas = operator["pandas"]
        # pyspark's worker: at most this many rows per DataFrame (none when not positive),
        # and, when a bytes limit is set, rows x average Arrow row size under it
        records = operator["maxRecordsPerBatch"]
        self.max_rows = records if records > 0 else 2**31 - 1
        self.max_bytes = operator.get("maxBytesPerBatch", 2**31 - 1)
        self._seen_bytes = self._seen_rows = 0

    def keys_of(self, batch: pa.RecordBatch, key_indices: list[int],
                value_indices: list[int], groups: list | None = None) -> Iterator[tuple]:
        """Per key of a batch sorted by key: the key (hashable: `groups`' item of its rows,
        by default the key columns' values), where its columns are, the key as the
        processor gets it, and its rows as the processor gets them (pandas: DataFrames of
        at most maxRecordsPerBatch rows; Row API: Rows)."""
        n = batch.num_rows
        if n == 0:
            return
        key_batch = batch.select(key_indices)
        if groups is None:
            groups = keycodec.rows(key_batch.columns, n)
        bounds = [0] + [i for i in range(1, n) if groups[i] != groups[i - 1]] + [n]
        if self.pandas:
            series = self.io.to_pandas(batch)
            frame = _as_from_rows(self.io._pd.concat([series[i] for i in value_indices],
                                                     axis=1))
            # as pyspark's worker makes them: Python scalars, from pandas
            keys = [series[i].tolist() for i in key_indices]
            if self.max_bytes != 2**31 - 1:
                self._seen_bytes += sum(b.size for c in batch.columns for b in c.buffers()
                                        if b is not None)
                self._seen_rows += n
        else:   # Python values once per batch: what as_py() per cell gives pyspark's worker
            columns = [batch.column(i).to_pylist() for i in value_indices]
            keys = [batch.column(i).to_pylist() for i in key_indices]
            DataRow = self._Row(*(batch.schema.names[i] for i in value_indices))
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            if self.pandas:
                items = self._chunks(frame, lo, hi)
            else:
                items = [DataRow(*(c[i] for c in columns)) for i in range(lo, hi)]
            yield groups[lo], (key_batch, lo), tuple(k[lo] for k in keys), items

    def whole_key(self, items: list, spans_batches: bool) -> list:
        """A key's rows as the processor gets them: DataFrames from two Arrow batches are
        joined and cut anew from the key's start, as pyspark's worker cuts them."""
        if spans_batches and self.pandas:
            return self._chunks(self.io._pd.concat(items, ignore_index=True), 0, None)
        return items

    def _chunks(self, frame, lo: int, hi: int | None) -> list:
        """Rows lo..hi of a frame as the DataFrames pyspark's worker hands over."""
        hi = len(frame) if hi is None else hi
        size = self.max_rows
        if self.max_bytes != 2**31 - 1 and self._seen_rows:
            average = self._seen_bytes / self._seen_rows
            size = min(size, max(1, math.ceil(self.max_bytes / average)))
        chunks = []
        for start in range(lo, hi, size):
            chunk = frame.iloc[start:min(hi, start + size)]
            chunk.index = self.io._pd.RangeIndex(len(chunk))
            chunks.append(chunk)
        return chunks
