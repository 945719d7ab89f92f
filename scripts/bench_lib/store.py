"""bench.py --store-ops: the in-memory stores of aggregation and deduplication side by side,
without Spark: keys in a dict (`KeyedRows`, the functions' families) against keys in a
compiled hash table (`HashedRows`, aggregation and deduplication), for a `long` key and a
(string, timestamp) key. Each store runs in a process of its own, so its resident memory is
its own: --state-rows keys put 50,000 at a time, then batches of 50,000 keys looked up (half
of them present) and removed. Prints, per key, the resident memory and the store's own
estimate (`stateMemory`), and the median microseconds a put, a lookup and a removal take."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa

BATCH = 50_000
KINDS = {
    "long": [pa.field("key", pa.int64())],
    "string, timestamp": [pa.field("user", pa.string()), pa.field("ts", pa.timestamp("us"))],
}


def _columns(kind: str, ids: np.ndarray) -> list[pa.Array]:
    if kind == "long":
        return [pa.array(ids)]
    return [pa.array([f"user-{i % 50_000}" for i in ids.tolist()]),
            pa.array(1_700_000_000_000_000 + ids * 1000, pa.timestamp("us"))]


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(kind: str, hashed: bool, n: int) -> dict:
    """One store's figures (run in a process of its own)."""
    import gc

    from arrowstate.store.versions.versioned import VersionedState

    fields = KINDS[kind]
    state = VersionedState(fields, [pa.field("n", pa.int64())], hashed=hashed)
    if hashed:   # in the table from the first key (a worker moves a state there at 500K)
        assert state.move_to_hash_table(0)
    rng = np.random.default_rng(5)
    gc.collect()
    before = _resident_bytes()
    put, lookup, pop = [], [], []
    for lo in range(0, n, BATCH):
        ids = rng.permutation(np.arange(lo, lo + BATCH, dtype=np.int64))
        columns = _columns(kind, ids)
        batch = pa.RecordBatch.from_arrays(columns + [pa.array(ids)], schema=state.schema)
        t0 = time.perf_counter()
        state.put_rows(state.keys(columns, BATCH), batch)
        put.append((time.perf_counter() - t0) / BATCH)
        state._changes.clear()   # no commit here: the delta is not the store's
    gc.collect()
    pa.default_memory_pool().release_unused()
    resident = _resident_bytes() - before
    estimate = state.memory_bytes()
    for _ in range(10):
        ids = rng.integers(0, 2 * n, BATCH)
        columns = _columns(kind, ids)
        t0 = time.perf_counter()
        state.rows.lookup(state.keys(columns, BATCH))
        lookup.append((time.perf_counter() - t0) / BATCH)
    for lo in range(0, min(n, 10 * BATCH), BATCH):
        columns = _columns(kind, np.arange(lo, lo + BATCH, dtype=np.int64))
        t0 = time.perf_counter()
        state.pop_present(state.keys(columns, BATCH))
        pop.append((time.perf_counter() - t0) / BATCH)
    return {"case": "store_ops", "key": kind, "store": type(state.rows).__name__, "keys": n,
            "resident_bytes_per_key": round(resident / n),
            "estimated_bytes_per_key": round(estimate / n),
            "put_us": round(statistics.median(put) * 1e6, 3),
            "lookup_us": round(statistics.median(lookup) * 1e6, 3),
            "pop_us": round(statistics.median(pop) * 1e6, 3)}


def store_ops(args) -> None:
    for kind in KINDS:
        for hashed in (False, True):
            out = subprocess.run(
                [sys.executable, __file__, kind, str(int(hashed)), str(args.state_rows)],
                check=True, capture_output=True, text=True).stdout
            print(out.strip(), flush=True)


if __name__ == "__main__":
    kind_, hashed_, n_ = sys.argv[1:4]
    print(json.dumps(measure(kind_, hashed_ == "1", int(n_))))
