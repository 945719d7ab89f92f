#!/usr/bin/env python3
"""Benchmark of candidate on-disk structures for a worker's state beyond memory (issue #25).

No Spark: a standalone model of a streaming aggregation's state (a count and a sum per key),
run against each candidate on the same deterministic workload:

  fill      N distinct int64 keys, written in batches of --fill-batch rows (blind puts);
  updates   --batches batches of --batch-rows rows, ~95% over random existing keys and
            --new-frac new keys; the rows are pre-aggregated per key (as Spark's partial
            aggregation hands a batch to the state), then each touched key's current value
            is looked up, added to and written back. Median per-batch time is reported;
  reopen    the store is closed, its files are fsynced and (unless --warm-reopen) dropped
            from the page cache with posix_fadvise(DONTNEED) (only this store's files: no
            global drop_caches), then a NEW process opens it and times the open and the
            first update batches after it; it then checks a sample of keys against values
            recomputed from the workload's definition;
  memory    VmRSS/VmHWM/RssAnon/RssFile from /proc/self/status (and Private_Dirty from
            /proc/self/smaps_rollup) of each phase's process: after the import of the
            candidate (`mem_base`), after the fill and after the updates (steady, after
            gc); RSS per key is (steady - base) / keys, also split into anonymous and
            file-backed pages. File-backed pages (RssFile: mmap'd data the process
            touched) are reclaimable by the kernel, anonymous ones are not.
  disk      bytes the store's directory occupies (st_blocks, so sparse files count as used).

Candidates (--candidates, comma-separated):
  dict         today's design in RAM, approximating store/rows.py: a dict from 8-byte key
               bytes to a row id, plus numpy key/count/sum columns (the Arrow chunks). It
               has no disk tier; its "reopen" is a rebuild from a saved copy of the
               columns, as a load from a snapshot rebuilds the dict today.
  lmdb         LMDB (PyPI `lmdb`): 8-byte big-endian keys, 16-byte packed values, one
               write transaction per batch, Cursor.getmulti / Cursor.putmulti. LMDB has no
               cache setting: its file is mmap'd and the OS page cache holds what fits.
  rocksdb      RocksDB (PyPI `rocksdict`, raw mode): reads by one get per key from a
               C-level map loop (--rocksdb-get map) or the binding's get on a list of keys
               (multi), writes by a WriteBatch filled by one put call per key (a C-level
               map loop too: the binding has no columnar get or put), WAL off (the disk
               tier is a cache rebuilt from the checkpoint). Budget: block cache
               --rocksdb-cache-mib (768 MiB; index and filter blocks charged to it) + 2
               memtables of 64 MiB = 896 MiB.
  sorted-mmap  numpy only: the keys sorted in a memory-mapped int64 file with the counts
               and sums in parallel memory-mapped files; lookups are np.searchsorted over
               the whole batch; existing keys are updated in place through the mappings;
               new keys go to an in-memory sorted delta, merged into new base files once
               it exceeds --delta-keys (default max(1M, N/8), capped at 4M keys, i.e. 96 MB
               of RAM). Its merge cost (O(N), amortised over the batches that filled the
               delta) is timed separately (`merges_s`, and `forced_merge_s` at the end).
               No Python object per key anywhere.
  sorted-lsm   as sorted-mmap, but the mapped base files are never written: changed keys
               join the delta too (the delta wins over the base), so a base generation plus
               a copy of the delta is a consistent frozen view and dropping the delta rolls
               a version back. Merges come more often (every batch's touched keys fill the
               delta), each O(N) sequential I/O.

Run (from the repository root; needs numpy, plus `pip install lmdb rocksdict` for those):

  python scripts/state_tier_bench.py --keys 1000000 --batches 5 --batch-rows 500000
  python scripts/state_tier_bench.py --keys 20000000 --candidates lmdb,rocksdb --json

Each candidate runs in its own processes (one for fill + updates, one for the reopen), one
candidate at a time; its data directory (under --dir) is deleted afterwards unless --keep.
The output is a table, or with --json one JSON line per candidate.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import importlib
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

CANDIDATES = ("dict", "lmdb", "rocksdb", "sorted-mmap", "sorted-lsm")
MIB = 1 << 20

# -- the workload ----------------------------------------------------------------------------
# Key i (0 <= i < keys ever created) is i * an odd constant mod 2^64: a bijection, so keys are
# distinct, spread over the whole int64 range and in no useful order.
_MULT = np.uint64(0x9E3779B97F4A7C15)


def key_of(i: np.ndarray) -> np.ndarray:
    return (i.astype(np.uint64) * _MULT).view(np.int64)


def fill_values(i: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fill's count and sum for key i (integral sums keep every check exact)."""
    return np.ones(len(i), np.int64), (i % 1000).astype(np.float64)


class Workload:
    def __init__(self, keys: int, batch_rows: int, new_frac: float, seed: int):
        self.keys, self.batch_rows, self.seed = keys, batch_rows, seed
        self.new_per_batch = int(round(batch_rows * new_frac))

    def keys_before(self, t: int) -> int:
        """Keys that exist before update batch t (0-based over the whole run)."""
        return self.keys + t * self.new_per_batch

    def batch(self, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Update batch t pre-aggregated per key: (key indices, keys, d_count, d_sum)."""
        rng = np.random.default_rng([self.seed, t])
        n = self.keys_before(t)
        old = rng.integers(0, n, self.batch_rows - self.new_per_batch)
        idx = np.concatenate([old, np.arange(n, n + self.new_per_batch)])
        values = rng.integers(0, 100, len(idx)).astype(np.float64)
        uniq, inverse = np.unique(idx, return_inverse=True)
        d_count = np.bincount(inverse, minlength=len(uniq)).astype(np.int64)
        d_sum = np.bincount(inverse, weights=values, minlength=len(uniq))
        perm = rng.permutation(len(uniq))          # the batch arrives in no key order
        return uniq[perm], key_of(uniq[perm]), d_count[perm], d_sum[perm]

    def expected(self, sample: np.ndarray, batches: int) -> tuple[np.ndarray, np.ndarray]:
        """Count and sum of the sampled key indices after the fill and `batches` updates."""
        count, total = fill_values(sample)
        count, total = np.where(sample < self.keys, count, 0), np.where(sample < self.keys,
                                                                         total, 0.0)
        for t in range(batches):
            idx, _, dc, ds = self.batch(t)
            order = np.argsort(idx)
            pos = np.searchsorted(idx[order], sample)
            pos = np.minimum(pos, len(idx) - 1)
            hit = idx[order][pos] == sample
            count = count + np.where(hit, dc[order][pos], 0)
            total = total + np.where(hit, ds[order][pos], 0.0)
        return count, total


# -- measuring -------------------------------------------------------------------------------
def memory() -> dict[str, int]:
    """This process's memory, in bytes, after handing freed heap back to the OS (glibc keeps
    freed blocks of numpy temporaries otherwise, which would be counted as the store's)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    out: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[name] = int(rest.split()[0]) * 1024
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name == "Private_Dirty":
                    out[name] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


def disk_bytes(path: str) -> int:
    total = 0
    for root, _, names in os.walk(path):
        for n in names:
            total += os.lstat(os.path.join(root, n)).st_blocks * 512
    return total


def drop_from_page_cache(path: str) -> None:
    """Writes back and evicts this directory's files from the page cache (only these)."""
    for root, _, names in os.walk(path):
        for n in names:
            fd = os.open(os.path.join(root, n), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


class Timer:
    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


# -- candidates ------------------------------------------------------------------------------
# Each store holds int64 key -> (count int64, sum float64) and offers, on numpy arrays:
#   put(keys, count, sum)        blind write (the fill)
#   update(keys, d_count, d_sum) look up, add (absent = 0), write back; keys distinct
#   get(keys) -> (count, sum)    absent keys read as (0, 0.0)
#   close()                      everything on disk, ready for a new process to open
VALUE = np.dtype([("count", "<i8"), ("sum", "<f8")])


def packed_values(count: np.ndarray, total: np.ndarray) -> np.ndarray:
    v = np.empty(len(count), VALUE)
    v["count"], v["sum"] = count, total
    return v


def key_bytes(keys: np.ndarray) -> list:
    """One 8-byte big-endian bytes object per key (V8, not S8: S8 would strip trailing
    zero bytes), as keys.py builds fixed-width keys."""
    return keys.astype(">i8").view("V8").tolist()


class DictStore:
    """Today's design in RAM (store/rows.py's shape): dict key bytes -> row id, and columns."""
    settings = "no budget: everything in RAM (the baseline)"

    def __init__(self, path: str, create: bool, args: argparse.Namespace):
        self.path = path
        os.makedirs(path, exist_ok=True)
        self.data: dict[bytes, int] = {}
        if create:
            self.n, cap = 0, 1 << 16
            self.k = np.empty(cap, np.int64)
            self.c = np.empty(cap, np.int64)
            self.s = np.empty(cap, np.float64)
        else:   # a restart: load the columns (the "snapshot") and rebuild the dict
            self.k = np.load(os.path.join(path, "k.npy"))
            self.c = np.load(os.path.join(path, "c.npy"))
            self.s = np.load(os.path.join(path, "s.npy"))
            self.n = len(self.k)
            self.data = dict(zip(key_bytes(self.k), range(self.n)))

    def _append(self, keys, count, total) -> None:
        m = len(keys)
        if self.n + m > len(self.k):   # grow by 1/8: little slack at any size
            cap = max(len(self.k) + len(self.k) // 8, self.n + m)
            for name in ("k", "c", "s"):
                old = getattr(self, name)
                new = np.empty(cap, old.dtype)
                new[: self.n] = old[: self.n]
                setattr(self, name, new)
        self.data.update(zip(key_bytes(keys), range(self.n, self.n + m)))
        self.k[self.n: self.n + m], self.c[self.n: self.n + m] = keys, count
        self.s[self.n: self.n + m] = total
        self.n += m

    def put(self, keys, count, total) -> None:
        self._append(keys, count, total)   # the fill's keys are new

    def _rows(self, kb: list) -> np.ndarray:
        return np.fromiter(map(self.data.get, kb, [-1] * len(kb)), np.int64, len(kb))

    def update(self, keys, d_count, d_sum) -> None:
        rows = self._rows(key_bytes(keys))
        hit = rows >= 0
        r = rows[hit]
        self.c[r] += d_count[hit]
        self.s[r] += d_sum[hit]
        new = ~hit
        self._append(keys[new], d_count[new], d_sum[new])

    def get(self, keys):
        rows = self._rows(key_bytes(keys))
        hit = rows >= 0
        return (np.where(hit, self.c[np.maximum(rows, 0)], 0),
                np.where(hit, self.s[np.maximum(rows, 0)], 0.0))

    def close(self) -> None:
        for name in ("k", "c", "s"):
            np.save(os.path.join(self.path, f"{name}.npy"), getattr(self, name)[: self.n])


class LmdbStore:
    """LMDB: one B+tree in a memory-mapped file; one write transaction per batch."""
    settings = ("map_size 64 GiB (virtual), sync/metasync off, readahead off; no cache "
                "setting (the OS page cache holds the mapped file)")

    def __init__(self, path: str, create: bool, args: argparse.Namespace):
        import lmdb
        self.env = lmdb.open(path, map_size=64 << 30, sync=False, metasync=False,
                             readahead=False, max_dbs=0, lock=True,
                             writemap=args.lmdb_writemap)
        if args.lmdb_writemap:
            self.settings += ", writemap on"

    def put(self, keys, count, total) -> None:
        order = np.argsort(keys.astype(">i8").view(">u8"))  # B+tree order: sequential pages
        kb = key_bytes(keys[order])
        vb = packed_values(count[order], total[order]).view("V16").tolist()
        with self.env.begin(write=True) as txn:
            txn.cursor().putmulti(zip(kb, vb))

    def update(self, keys, d_count, d_sum) -> None:
        order = np.argsort(keys.astype(">i8").view(">u8"))
        keys, d_count, d_sum = keys[order], d_count[order], d_sum[order]
        kb = key_bytes(keys)
        with self.env.begin(write=True) as txn:
            cur = txn.cursor()
            count, total = self._read(cur, keys, kb)
            vb = packed_values(count + d_count, total + d_sum).view("V16").tolist()
            cur.putmulti(zip(kb, vb))

    @staticmethod
    def _read(cur, keys, kb):
        found = cur.getmulti(kb)           # (key, value) of the keys present, in order
        count, total = np.zeros(len(keys), np.int64), np.zeros(len(keys), np.float64)
        if found:
            fk, fv = zip(*found)
            at = np.frombuffer(b"".join(fk), ">i8").astype(np.int64)
            pos = np.searchsorted(keys.astype(">i8").view(">u8"),
                                  at.astype(">i8").view(">u8"))
            vals = np.frombuffer(b"".join(fv), VALUE)
            count[pos], total[pos] = vals["count"], vals["sum"]
        return count, total

    def get(self, keys):
        uniq, inverse = np.unique(keys.astype(">i8").view(">u8"), return_inverse=True)
        uniq = uniq.view(">i8").astype(np.int64)   # in the tree's order, without repeats
        with self.env.begin() as txn:
            count, total = self._read(txn.cursor(), uniq, key_bytes(uniq))
        return count[inverse], total[inverse]

    def live_bytes(self) -> int:
        """Pages the tree uses now; the rest of the file is pages freed by copy-on-write."""
        st = self.env.stat()
        return (st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]) * st["psize"]

    def close(self) -> None:
        self.env.sync(True)
        self.env.close()


class RocksStore:
    """RocksDB through rocksdict in raw mode (bytes in, bytes out)."""
    def __init__(self, path: str, create: bool, args: argparse.Namespace):
        self.settings = (f"block cache {args.rocksdb_cache_mib} MiB with index+filter blocks "
                         "charged to it, bloom 10 bits/key, write buffer 64 MiB x 2, LZ4, "
                         "WAL off, 2 background jobs")
        from rocksdict import (BlockBasedOptions, Cache, DBCompressionType, Options, Rdict,
                               WriteOptions)
        cache = Cache(args.rocksdb_cache_mib * MIB)

        def options():
            opts = Options(raw_mode=True)
            opts.create_if_missing(True)
            table = BlockBasedOptions()
            table.set_block_cache(cache)
            table.set_cache_index_and_filter_blocks(True)
            table.set_pin_l0_filter_and_index_blocks_in_cache(True)
            table.set_bloom_filter(10, False)
            opts.set_block_based_table_factory(table)
            opts.set_write_buffer_size(64 * MIB)
            opts.set_max_write_buffer_number(2)
            opts.set_compression_type(DBCompressionType.lz4())
            opts.set_max_background_jobs(2)
            return opts
        # The column family's options too: given none, rocksdict opens an existing database
        # with the options stored in it, whose block cache is the 8 MiB default.
        self.db = Rdict(path, options(), column_families={"default": options()})
        assert self.db.property_int_value("rocksdb.block-cache-capacity") == \
            args.rocksdb_cache_mib * MIB
        wo = WriteOptions()
        wo.disable_wal = True
        self.db.set_write_options(wo)
        self._zero = bytes(16)
        self.multi_get = args.rocksdb_get == "multi"
        self.settings += f", reads by {args.rocksdb_get} get"

    def _write(self, kb: list, vb: list) -> None:
        from collections import deque
        from rocksdict import WriteBatch
        wb = WriteBatch(raw_mode=True)
        deque(map(wb.put, kb, vb), maxlen=0)   # one call per key, from a C-level loop
        self.db.write(wb)

    def put(self, keys, count, total) -> None:
        self._write(key_bytes(keys), packed_values(count, total).view("V16").tolist())

    def _read(self, kb: list):
        if self.multi_get:   # the binding's list get
            got = self.db.get(kb, default=self._zero)
        else:                # one get per key from a C-level map loop (faster in rocksdict)
            got = map(self.db.get, kb, itertools.repeat(self._zero))
        vals = np.frombuffer(b"".join(got), VALUE)
        return vals["count"], vals["sum"]

    def update(self, keys, d_count, d_sum) -> None:
        kb = key_bytes(keys)
        count, total = self._read(kb)
        self._write(kb, packed_values(count + d_count, total + d_sum).view("V16").tolist())

    def get(self, keys):
        return self._read(key_bytes(keys))

    def close(self) -> None:
        self.db.flush(True)
        self.db.close()


class SortedMmapStore:
    """Sorted keys in a memory-mapped file, values in parallel mapped files, an in-RAM sorted
    delta; every operation is a numpy call over the whole batch.

    In place (this class): existing keys' values are changed through the writable mappings
    and only new keys go to the delta. `SortedLsmStore` keeps the base files immutable."""
    inplace = True

    def __init__(self, path: str, create: bool, args: argparse.Namespace):
        self.path = path
        os.makedirs(path, exist_ok=True)
        self.delta_cap = args.delta_keys or int(min(4_000_000, max(1_000_000, args.keys // 8)))
        what = "new keys" if self.inplace else "changed and new keys"
        self.settings = (f"delta of {what} in RAM up to {self.delta_cap} keys "
                         f"({self.delta_cap * 24 // MIB} MiB + sort temporaries); base files "
                         "mmap'd (no cache setting: the OS page cache)")
        self.merge_s: list[float] = []
        meta = os.path.join(path, "meta.json")
        if create or not os.path.exists(meta):
            self.gen, self.n = 0, 0
            self._write_base(0, [np.empty(0, np.int64), np.empty(0, np.int64),
                                 np.empty(0, np.float64)])
            self.dk, self.dc, self.ds = (np.empty(0, np.int64), np.empty(0, np.int64),
                                         np.empty(0, np.float64))
        else:
            with open(meta) as f:
                m = json.load(f)
            self.gen, self.n = m["gen"], m["n"]
            d = np.load(os.path.join(path, "delta.npy"))
            self.dk, self.dc, self.ds = d["key"].copy(), d["count"].copy(), d["sum"].copy()
        self._map()

    # files
    def _file(self, gen: int, col: str) -> str:
        return os.path.join(self.path, f"base{gen}.{col}")

    def _write_base(self, gen: int, parts) -> None:
        for col, arr in zip(("k", "c", "s"), parts):
            arr.tofile(self._file(gen, col))

    def _map(self) -> None:
        mode = "r+" if self.inplace else "r"

        def mm(col, dtype):
            if self.n == 0:
                return np.empty(0, dtype)
            return np.memmap(self._file(self.gen, col), dtype, mode, shape=(self.n,))
        self.bk, self.bc, self.bs = mm("k", np.int64), mm("c", np.int64), mm("s", np.float64)

    def _unmap(self) -> None:
        for a in (self.bc, self.bs):
            if isinstance(a, np.memmap) and self.inplace:
                a.flush()
        self.bk = self.bc = self.bs = None

    # lookups
    @staticmethod
    def _find(sorted_keys: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each key: present?, and its position in sorted_keys where present."""
        if len(sorted_keys) == 0:
            return np.zeros(len(keys), bool), np.zeros(len(keys), np.int64)
        pos = np.searchsorted(sorted_keys, keys)
        pos = np.minimum(pos, len(sorted_keys) - 1)
        return sorted_keys[pos] == keys, pos

    def put(self, keys, count, total) -> None:
        self._add_to_delta(keys, count, total)

    def update(self, keys, d_count, d_sum) -> None:
        order = np.argsort(keys)        # sorted probes walk the mapped pages in file order
        keys, d_count, d_sum = keys[order], d_count[order], d_sum[order]
        # the delta first: it holds the newest value of every key it has
        in_delta, dpos = self._find(self.dk, keys)
        p = dpos[in_delta]
        self.dc[p] += d_count[in_delta]
        self.ds[p] += d_sum[in_delta]
        rest = ~in_delta
        in_base, bpos = self._find(self.bk, keys)
        in_base &= rest
        p = bpos[in_base]
        if self.inplace:
            self.bc[p] += d_count[in_base]
            self.bs[p] += d_sum[in_base]
            new = rest & ~in_base
            self._add_to_delta(keys[new], d_count[new], d_sum[new])
        else:   # the base stays as it is: changed keys join the delta with their new values
            count, total = d_count[rest], d_sum[rest]
            from_base = in_base[rest]
            count[from_base] += self.bc[p]
            total[from_base] += self.bs[p]
            self._add_to_delta(keys[rest], count, total)

    def get(self, keys):
        count, total = np.zeros(len(keys), np.int64), np.zeros(len(keys), np.float64)
        hit, pos = self._find(self.bk, keys)
        count[hit], total[hit] = self.bc[pos[hit]], self.bs[pos[hit]]
        hit, pos = self._find(self.dk, keys)     # the delta wins
        count[hit], total[hit] = self.dc[pos[hit]], self.ds[pos[hit]]
        return count, total

    def _add_to_delta(self, keys, count, total) -> None:
        """Adds keys absent from the delta (sorted merge of two arrays)."""
        k = np.concatenate([self.dk, keys])
        order = np.argsort(k, kind="stable")
        self.dk = k[order]
        self.dc = np.concatenate([self.dc, count])[order]
        self.ds = np.concatenate([self.ds, total])[order]
        if len(self.dk) >= self.delta_cap:
            self.merge()

    def merge(self, chunk: int = 1 << 22) -> None:
        """Writes base + delta (the delta's values win) as the next generation's files, a
        chunk of the base at a time (RAM: one chunk, not the base), then maps them and
        deletes the old ones. Sequential I/O: O(base + delta)."""
        t0 = time.perf_counter()
        if len(self.dk) == 0:
            return
        gen, n, added = self.gen + 1, self.n, 0
        files = [open(self._file(gen, col), "wb") for col in ("k", "c", "s")]
        try:
            d_lo = 0
            for lo in range(0, max(n, 1), chunk):
                hi = min(lo + chunk, n)
                d_hi = (len(self.dk) if hi >= n
                        else int(np.searchsorted(self.dk, self.bk[hi - 1], side="right")))
                bk, dk = np.asarray(self.bk[lo:hi]), self.dk[d_lo:d_hi]
                pos = np.searchsorted(bk, dk)
                hit = pos < len(bk)
                hit[hit] = bk[pos[hit]] == dk[hit]
                new = ~hit
                at = pos[new] + np.arange(int(new.sum()))     # new keys' places in the output
                is_new = np.zeros(len(bk) + len(at), bool)
                is_new[at] = True
                for f, b, d in zip(files, (self.bk, self.bc, self.bs),
                                   (self.dk, self.dc, self.ds)):
                    part = np.array(b[lo:hi])
                    part[pos[hit]] = d[d_lo:d_hi][hit]
                    out = np.empty(len(is_new), d.dtype)
                    out[at] = d[d_lo:d_hi][new]
                    out[~is_new] = part
                    out.tofile(f)
                added += len(at)
                d_lo = d_hi
        finally:
            for f in files:
                f.close()
        old = self.gen
        self._unmap()
        self.gen, self.n = gen, n + added
        self.dk, self.dc, self.ds = (np.empty(0, np.int64), np.empty(0, np.int64),
                                     np.empty(0, np.float64))
        self._save_meta()
        for col in ("k", "c", "s"):
            os.remove(self._file(old, col))
        self._map()
        self.merge_s.append(time.perf_counter() - t0)

    def _save_meta(self) -> None:
        d = np.rec.fromarrays([self.dk, self.dc, self.ds], names="key,count,sum")
        np.save(os.path.join(self.path, "delta.npy"), d)
        with open(os.path.join(self.path, "meta.json"), "w") as f:
            json.dump({"gen": self.gen, "n": self.n}, f)

    def close(self) -> None:
        self._unmap()
        self._save_meta()


class SortedLsmStore(SortedMmapStore):
    """As SortedMmapStore, but the mapped base files are never written: every changed key
    goes to the delta, so a base generation plus a copy of the delta is a consistent frozen
    view (for a snapshot thread) and dropping the delta rolls a version back."""
    inplace = False


STORES = {"dict": DictStore, "lmdb": LmdbStore, "rocksdb": RocksStore,
          "sorted-mmap": SortedMmapStore, "sorted-lsm": SortedLsmStore}


# -- phases (each in its own process) --------------------------------------------------------
def import_library(candidate: str) -> None:
    """Imports the candidate's library before the base RSS is read."""
    lib = {"lmdb": "lmdb", "rocksdb": "rocksdict"}.get(candidate)
    if lib:
        importlib.import_module(lib)


def phase_run(args: argparse.Namespace, path: str) -> dict[str, Any]:
    """Fill and updates in this process; returns its measurements."""
    wl = Workload(args.keys, args.batch_rows, args.new_frac, args.seed)
    cls = STORES[args.candidate]
    import_library(args.candidate)
    gc.collect()
    out: dict[str, Any] = {"mem_base": memory()}
    store = cls(path, True, args)
    out["settings"] = store.settings
    fill_wall = fill_cpu = 0.0
    for lo in range(0, args.keys, args.fill_batch):
        i = np.arange(lo, min(lo + args.fill_batch, args.keys))
        keys = key_of(i)
        count, total = fill_values(i)
        with Timer() as t:
            store.put(keys, count, total)
        fill_wall += t.wall
        fill_cpu += t.cpu
    out.update(fill_s=fill_wall, fill_cpu_s=fill_cpu)
    gc.collect()
    out["mem_after_fill"] = memory()
    walls, cpus = [], []
    for b in range(args.batches):
        _, keys, dc, ds = wl.batch(b)
        with Timer() as t:
            store.update(keys, dc, ds)
        walls.append(t.wall)
        cpus.append(t.cpu)
        del keys, dc, ds
    gc.collect()
    out.update(batch_s=walls, batch_cpu_s=cpus, mem_steady=memory())
    if isinstance(store, LmdbStore):
        out["live_bytes"] = store.live_bytes()
    with Timer() as t:
        store.close()
    out["close_s"] = t.wall
    if isinstance(store, SortedMmapStore):
        out["merges_s"] = store.merge_s
    del store
    gc.collect()
    out["mem_end"] = memory()
    out["disk_bytes"] = disk_bytes(path)
    return out


def phase_reopen(args: argparse.Namespace, path: str) -> dict[str, Any]:
    """A new process: open the closed store, time the open and the first batches after it,
    then verify a sample of keys."""
    wl = Workload(args.keys, args.batch_rows, args.new_frac, args.seed)
    import_library(args.candidate)
    gc.collect()
    out: dict[str, Any] = {"mem_base": memory()}
    with Timer() as t:
        store = STORES[args.candidate](path, False, args)
    out["open_s"] = t.wall
    walls = []
    for b in range(args.batches, args.batches + args.reopen_batches):
        _, keys, dc, ds = wl.batch(b)
        with Timer() as t:
            store.update(keys, dc, ds)
        walls.append(t.wall)
    out["reopen_batch_s"] = walls
    gc.collect()
    out["mem_after_reopen"] = memory()
    if isinstance(store, SortedMmapStore):   # one forced merge: its O(N) cost at this size
        out["forced_merge_delta_keys"] = len(store.dk)
        with Timer() as t:
            store.merge()
        out["forced_merge_s"] = t.wall
    total_batches = args.batches + args.reopen_batches
    n_now = wl.keys_before(total_batches)
    rng = np.random.default_rng([args.seed, 999])
    sample = np.concatenate([rng.integers(0, n_now, 20000),
                             np.arange(n_now, n_now + 10)])   # absent keys too
    exp_c, exp_s = wl.expected(sample, total_batches)
    got_c, got_s = store.get(key_of(sample))
    out["verified"] = bool(np.array_equal(got_c, exp_c) and np.array_equal(got_s, exp_s))
    out["verified_keys"] = len(sample)
    store.close()
    out["disk_bytes_end"] = disk_bytes(path)
    return out


# -- driver ----------------------------------------------------------------------------------
def run_candidate(args: argparse.Namespace, name: str) -> dict[str, Any]:
    path = os.path.join(args.dir, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(args.dir, exist_ok=True)
    common = [sys.executable, os.path.abspath(__file__), "--candidate", name, "--dir", args.dir,
              "--keys", str(args.keys), "--batches", str(args.batches),
              "--batch-rows", str(args.batch_rows), "--new-frac", str(args.new_frac),
              "--fill-batch", str(args.fill_batch), "--seed", str(args.seed),
              "--reopen-batches", str(args.reopen_batches),
              "--delta-keys", str(args.delta_keys),
              "--rocksdb-cache-mib", str(args.rocksdb_cache_mib),
              "--rocksdb-get", args.rocksdb_get] + (["--lmdb-writemap"] if args.lmdb_writemap
                                                    else [])
    result: dict[str, Any] = {"candidate": name, "keys": args.keys, "batches": args.batches,
                              "batch_rows": args.batch_rows, "new_frac": args.new_frac}
    try:
        for phase in ("run", "reopen"):
            if phase == "reopen" and not args.warm_reopen:
                drop_from_page_cache(path)
            p = subprocess.run(common + ["--phase", phase], capture_output=True, text=True)
            if p.returncode != 0:
                result["error"] = f"{phase}: exit {p.returncode}: {p.stderr.strip()[-2000:]}"
                break
            result[phase] = json.loads(p.stdout.strip().splitlines()[-1])
    finally:
        if not args.keep:
            shutil.rmtree(path, ignore_errors=True)
    return result


def summary(r: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers of one candidate's result."""
    s: dict[str, Any] = {"candidate": r["candidate"]}
    run, re_ = r.get("run"), r.get("reopen")
    if run:
        keys_after = r["keys"] + r["batches"] * int(round(r["batch_rows"] * r["new_frac"]))
        steady, base = run["mem_steady"], run["mem_base"]
        s.update(
            fill_s=round(run["fill_s"], 2),
            batch_median_s=round(statistics.median(run["batch_s"]), 3),
            batch_mean_s=round(statistics.mean(run["batch_s"]), 3),
            batch_max_s=round(max(run["batch_s"]), 3),
            batch_cpu_median_s=round(statistics.median(run["batch_cpu_s"]), 3),
            rss_steady_mib=round(steady["VmRSS"] / MIB),
            rss_anon_mib=round(steady.get("RssAnon", 0) / MIB),
            rss_file_mib=round(steady.get("RssFile", 0) / MIB),
            rss_per_key=round((steady["VmRSS"] - base["VmRSS"]) / keys_after, 1),
            anon_per_key=round((steady["RssAnon"] - base["RssAnon"]) / keys_after, 1),
            file_per_key=round((steady["RssFile"] - base["RssFile"]) / keys_after, 1),
            peak_rss_mib=round(steady["VmHWM"] / MIB),
            disk_mib=round(run["disk_bytes"] / MIB),
            disk_per_key=round(run["disk_bytes"] / keys_after, 1),
            **({"tree_mib": round(run["live_bytes"] / MIB)} if "live_bytes" in run else {}),
            settings=run["settings"])
    if re_:
        s.update(open_s=round(re_["open_s"], 2),
                 first_batch_after_reopen_s=round(re_["reopen_batch_s"][0], 3),
                 reopen_batches_s=[round(x, 3) for x in re_["reopen_batch_s"]],
                 reopen_rss_mib=round(re_["mem_after_reopen"]["VmRSS"] / MIB),
                 reopen_peak_mib=round(re_["mem_after_reopen"]["VmHWM"] / MIB),
                 verified=re_["verified"])
        if "forced_merge_s" in re_:
            s["forced_merge_s"] = round(re_["forced_merge_s"], 2)
            s["forced_merge_delta_keys"] = re_["forced_merge_delta_keys"]
    if run and run.get("merges_s"):
        s["merges_during_run"] = len(run["merges_s"])
        s["merge_max_s"] = round(max(run["merges_s"]), 2)
    if "error" in r:
        s["error"] = r["error"]
    return s


def versions() -> dict[str, str]:
    from importlib import metadata
    out = {"python": sys.version.split()[0], "numpy": np.__version__}
    for pkg in ("lmdb", "rocksdict"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    try:
        import lmdb
        out["liblmdb"] = ".".join(map(str, lmdb.version()))
    except ImportError:
        pass
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=1_000_000, help="distinct keys filled (N)")
    ap.add_argument("--batches", type=int, default=5, help="update batches (M)")
    ap.add_argument("--batch-rows", type=int, default=500_000, help="rows per update batch")
    ap.add_argument("--new-frac", type=float, default=0.05, help="new keys per batch row")
    ap.add_argument("--fill-batch", type=int, default=1_000_000, help="keys per fill write")
    ap.add_argument("--reopen-batches", type=int, default=2,
                    help="batches timed after the reopen (the first is the cold one)")
    ap.add_argument("--candidates", default=",".join(CANDIDATES),
                    help=f"comma-separated, of {', '.join(CANDIDATES)}")
    ap.add_argument("--dir", default="/tmp/state_tier_bench", help="data directory")
    ap.add_argument("--delta-keys", type=int, default=0,
                    help="sorted-mmap, sorted-lsm: delta size that triggers a merge (0: "
                         "max(1M, N/8), at most 4M)")
    ap.add_argument("--rocksdb-cache-mib", type=int, default=768,
                    help="rocksdb: block cache size (plus 2 x 64 MiB memtables)")
    ap.add_argument("--rocksdb-get", choices=("map", "multi"), default="map",
                    help="rocksdb: one get per key in a C-level map loop, or the binding's "
                         "list get (slower in rocksdict 0.3.29 at 1M keys)")
    ap.add_argument("--lmdb-writemap", action="store_true",
                    help="lmdb: write through the writable map (MDB_WRITEMAP)")
    ap.add_argument("--seed", type=int, default=25)
    ap.add_argument("--warm-reopen", action="store_true",
                    help="keep the store's files in the page cache across the reopen")
    ap.add_argument("--keep", action="store_true", help="keep the data directories")
    ap.add_argument("--json", action="store_true", help="one JSON line per candidate")
    ap.add_argument("--full", action="store_true", help="with --json: every raw measurement")
    ap.add_argument("--phase", choices=("run", "reopen"), help=argparse.SUPPRESS)
    ap.add_argument("--candidate", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.phase:
        path = os.path.join(args.dir, args.candidate)
        fn = phase_run if args.phase == "run" else phase_reopen
        print(json.dumps(fn(args, path)))
        return 0

    names = [c.strip() for c in args.candidates.split(",") if c.strip()]
    unknown = [c for c in names if c not in STORES]
    if unknown:
        ap.error(f"unknown candidates: {unknown}")
    vers = versions()
    print(f"# {vers}; keys={args.keys} batches={args.batches} batch_rows={args.batch_rows} "
          f"new_frac={args.new_frac} fill_batch={args.fill_batch} cold_reopen="
          f"{not args.warm_reopen}", file=sys.stderr)
    ok = True
    for name in names:
        r = run_candidate(args, name)
        s = summary(r)
        ok &= "error" not in s and s.get("verified", False)
        if args.json:
            line = dict(s, versions=vers, command=" ".join(sys.argv))
            if args.full:
                line["raw"] = r
            print(json.dumps(line), flush=True)
        else:
            print(f"\n== {name}")
            for k, v in s.items():
                if k != "candidate":
                    print(f"  {k:28} {v}")
            sys.stdout.flush()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
