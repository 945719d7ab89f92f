"""Writing a run's files (the layout is in `runs`) from entries in key order: its keys, the
alive flags, the Arrow rows a block at a time, its fences and its Bloom filter."""
from __future__ import annotations

import contextlib
import os

import numpy as np
import pyarrow as pa

from . import runs
from .bloom import Bloom, BloomBuilder
from .runs import LocalStateWriteFailed, Run, delete_run_files


class RunWriter:
    """Writes a run's files from entries in key order."""

    def __init__(self, path: str, schema: pa.Schema, expected: int,
                 bloom: "Bloom | None" = None, prefix_width: int | None = None) -> None:
        """`expected`: at least the keys it will hold; `bloom`: their filter, if made (else
        one is made, by the keys' first `prefix_width` bytes when given)."""
        self.path = path
        self.n, self.has_dead = 0, False
        self.fences: list[np.ndarray] = []
        self.bloom = BloomBuilder(expected, prefix_width) if bloom is None else bloom
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        try:
            self._keys = open(path + ".keys", "wb")
            self._alive = open(path + ".alive", "wb")
            self._sink = pa.OSFile(path + ".arrow", "wb")
            self._arrow = pa.ipc.new_file(self._sink, schema)
        except OSError as e:
            raise LocalStateWriteFailed(path, e) from e

    def write(self, keys: np.ndarray, alive: np.ndarray, rows: pa.RecordBatch) -> None:
        try:
            start = (-self.n) % runs.BLOCK   # the first key of each new block is a fence
            self.fences.append(keys[start::runs.BLOCK].copy())
            if isinstance(self.bloom, BloomBuilder):
                self.bloom.add(keys)
            self._keys.write(memoryview(np.ascontiguousarray(keys)).cast("B"))
            self._alive.write(alive.astype(np.uint8).tobytes())
            self.has_dead |= not alive.all()
            self.n += len(keys)
            self._pending.append(rows)
            self._pending_rows += rows.num_rows
            while self._pending_rows >= runs.BLOCK:
                self._flush_block(runs.BLOCK)
        except OSError as e:
            raise LocalStateWriteFailed(self.path, e) from e

    def _flush_block(self, size: int) -> None:
        rows = pa.concat_batches(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._arrow.write_batch(rows.slice(0, size))
        rest = rows.slice(size)
        self._pending = [rest] if rest.num_rows else []
        self._pending_rows = rest.num_rows

    def finish(self, dtype: np.dtype) -> Run:
        try:
            if self._pending_rows:
                self._flush_block(self._pending_rows)
            self._arrow.close()
            self._sink.close()
            self._keys.close()
            self._alive.close()
        except OSError as e:
            raise LocalStateWriteFailed(self.path, e) from e
        if not self.has_dead:
            os.remove(self.path + ".alive")
        run = Run(self.n)
        run.path, run.has_dead = self.path, self.has_dead
        run.fences = (np.concatenate(self.fences) if self.fences
                      else np.zeros(0, dtype=dtype))
        run.bloom = (self.bloom.finish(dtype) if isinstance(self.bloom, BloomBuilder)
                     else self.bloom)
        run.disk_bytes = sum(os.path.getsize(self.path + s) for s in
                             ((".keys", ".alive", ".arrow") if self.has_dead
                              else (".keys", ".arrow")))
        return run

    def abandon(self) -> None:
        # abandoned, its files go: closing one may fail as the write did (a full disk)
        for close in (self._keys.close, self._alive.close, self._arrow.close,
                      self._sink.close):
            with contextlib.suppress(pa.ArrowException, OSError):
                close()
        delete_run_files(self.path)
