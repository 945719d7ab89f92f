"""Bloom filters over a sorted run's keys, so that a key absent from a run (a new key) is
found absent without a search or a read: 10 bits a key, about 1% false positives. A store
scanned by key prefix (see `TieredRows`) filters by the prefix alone: one filter then
answers both a whole key (by its prefix) and a prefix."""
from __future__ import annotations

import numpy as np

from ...keys import mix64 as _mix, prefixes

BLOOM_BITS_PER_KEY = 10   # about 1% false positives with BLOOM_HASHES
BLOOM_HASHES = 5
SEGMENT_KEYS = 52428      # keys per segment: 10 bits a key in 2**19 bits
BLOOM_MIN_KEYS = 1 << 12  # a smaller run in memory is searched at once: no filter

_U = np.uint64


def key_hashes(keys: np.ndarray, width: int | None = None) -> np.ndarray:
    """A 64-bit hash of each key (int64 or fixed-width bytes), or of its first `width`
    bytes (its prefix)."""
    if keys.dtype == np.int64:
        return _mix(keys.view(_U))
    if width is not None:
        keys = prefixes(keys, width)
    width = keys.dtype.itemsize
    words = -(-width // 8)
    raw = np.zeros((len(keys), words * 8), dtype=np.uint8)
    raw[:, :width] = np.ascontiguousarray(keys).view(np.uint8).reshape(len(keys), width)
    raw = raw.view(_U)
    h = np.full(len(keys), _U(width), dtype=_U)
    for w in range(words):
        h = _mix(h ^ raw[:, w])
    return h


class Bloom:
    """A Bloom filter over a run's keys, in segments of SEGMENT_KEYS consecutive keys (in key
    order), each with bits of its own: a key's segment is found by its first key, so a
    filter is built a segment at a time as a run is written, with small temporaries."""

    __slots__ = ("bits", "firsts", "segment_bits")

    def __init__(self, bits: np.ndarray, firsts: np.ndarray, segment_bits: int) -> None:
        self.bits, self.firsts, self.segment_bits = bits, firsts, segment_bits

    @property
    def nbytes(self) -> int:
        return self.bits.nbytes + self.firsts.nbytes

    @staticmethod
    def positions(hashes: np.ndarray, segment_bits: int):
        mask = _U(segment_bits - 1)
        step = _mix(hashes ^ _U(0x9E3779B97F4A7C15)) | _U(1)
        for i in range(BLOOM_HASHES):
            yield ((hashes + _U(i) * step) & mask).astype(np.int64)

    def may_hold(self, probes: np.ndarray, hashes: np.ndarray,
                 highest: np.ndarray | None = None) -> np.ndarray:
        """Whether the run may hold each probe: a key, or with `highest` (each probe's
        highest key) a range of keys that share a prefix, `hashes` being the prefix's."""
        segment = np.searchsorted(self.firsts, probes, side="right") - 1
        if highest is None:
            maybe = segment >= 0            # below the run's first key: not in it
        else:   # a range may start below a segment's first key and end in it, or span two
            last = np.searchsorted(self.firsts, highest, side="right") - 1
            maybe = last >= 0
            segment = np.maximum(segment, 0)
            spans = last > segment
        base = np.maximum(segment, 0) * self.segment_bits
        for positions in self.positions(hashes, self.segment_bits):
            positions += base
            maybe &= (self.bits[positions >> 3] >> (positions & 7).astype(np.uint8)) & 1 == 1
        if highest is not None:
            maybe |= spans
        return maybe


class BloomBuilder:
    """Builds a run's Bloom from its keys in key order, a segment at a time; `expected`
    keys (at least) size each segment's bits; with `width`, of the keys' prefixes."""

    def __init__(self, expected: int, width: int | None = None) -> None:
        self.width = width
        self.segment_bits = 64
        while self.segment_bits < min(max(expected, 1), SEGMENT_KEYS) * BLOOM_BITS_PER_KEY:
            self.segment_bits *= 2
        self._parts: list[np.ndarray] = []
        self._firsts: list[np.ndarray] = []
        self._keys: list[np.ndarray] = []
        self._pending = 0

    def add(self, keys: np.ndarray) -> None:
        self._keys.append(keys)
        self._pending += len(keys)
        while self._pending >= SEGMENT_KEYS:
            self._segment(SEGMENT_KEYS)

    def _segment(self, size: int) -> None:
        keys = np.concatenate(self._keys) if len(self._keys) > 1 else self._keys[0]
        segment, rest = keys[:size], keys[size:]
        self._keys, self._pending = ([rest] if len(rest) else []), len(rest)
        marks = np.zeros(self.segment_bits, dtype=bool)
        for positions in Bloom.positions(key_hashes(segment, self.width), self.segment_bits):
            marks[positions] = True
        self._parts.append(np.packbits(marks, bitorder="little"))
        self._firsts.append(segment[:1])

    def finish(self, dtype: np.dtype) -> Bloom:
        if self._pending:
            self._segment(self._pending)
        firsts = np.concatenate(self._firsts) if self._firsts else np.zeros(0, dtype)
        bits = (np.concatenate(self._parts) if self._parts else np.zeros(0, np.uint8))
        return Bloom(bits, firsts, self.segment_bits)
