"""The candidate stores of scripts/state_tier_bench.py: today's dict in RAM, LMDB, RocksDB,
and sorted memory-mapped numpy (updated in place, or log-structured). Each opens a data
directory, fills, looks up and updates batches of int64 keys with (count, sum) values; the
benchmark times and measures them."""
from __future__ import annotations

import argparse
import itertools
import json
import os
import time

import numpy as np

MIB = 1 << 20

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
