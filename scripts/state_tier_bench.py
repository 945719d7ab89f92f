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
import contextlib
import ctypes
import gc
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

# the candidates, beside this script (its directory is on sys.path when it runs)
from state_tier_stores import STORES, LmdbStore, SortedMmapStore

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
    with contextlib.suppress(OSError, AttributeError):   # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    out: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[name] = int(rest.split()[0]) * 1024
    with contextlib.suppress(OSError):   # kernels before 4.14 have no smaps_rollup
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name == "Private_Dirty":
                    out[name] = int(rest.split()[0]) * 1024
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
    with contextlib.suppress(ImportError):   # listed "not installed" above
        import lmdb
        out["liblmdb"] = ".".join(map(str, lmdb.version()))
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
