"""bench.py --state-load: what verifying state files costs when a worker loads state."""
from __future__ import annotations

import json
import statistics
import time

import numpy as np
import pyarrow as pa


def state_load(args) -> None:
    """What verifying state files costs when a worker loads state (no Spark): a partition
    of --state-rows groups (string key, time, count, sum) as a snapshot plus 10 deltas of
    5% updates; the median load time and the part of it spent decoding the files, which is
    verifying them (CRC-32, Arrow's full validation, the checks of columns, rows and ops)."""
    from arrowstate import keys as keycodec
    from arrowstate.store.versions.versioned import VersionedState
    from arrowstate.store.formats import decoding, names as file_names
    from arrowstate.store.lifecycle.chains import load_plans
    from arrowstate.store.lifecycle.sources import columns_reader

    rng = np.random.default_rng(3)
    n = args.state_rows
    key_fields = [pa.field("user", pa.string()), pa.field("ts", pa.timestamp("us", tz="UTC"))]
    value_fields = [pa.field("n", pa.int64()), pa.field("total", pa.float64())]
    state = VersionedState(key_fields, value_fields)
    written = {}

    def put(ids):
        batch = pa.RecordBatch.from_arrays([
            pa.array([f"user-{i}" for i in ids.tolist()]),
            pa.array(1_700_000_000_000_000 + ids * 1000, pa.timestamp("us", tz="UTC")),
            pa.array(rng.integers(0, 100, len(ids))), pa.array(rng.random(len(ids)))],
            names=["a", "b", "c", "d"])
        state.put_rows(keycodec.rows(batch.columns[:2], len(ids)), batch)

    for version in range(1, 12):
        put(np.arange(n) if version == 1 else rng.integers(0, n, n // 20))
        state.lifecycle.wait_for_snapshot()
        done = state.commit_files(version, 1000)
        written.update(done.written())
        written.update((file_names.file_name(file_names.SNAPSHOT, v), b) for v, b in done.snapshots)
        state.mark_committed(version, 1 if version == 1 else 1000)
        if version == 1:
            state.lifecycle.wait_for_snapshot()
    plans, _ = load_plans(list(written), 11, "bench", "bench")
    chain = plans[0][0]   # the snapshot of version 1 and 10 deltas

    class Source:
        where, context = "bench", "bench"
        names = staticmethod(lambda: list(written))
        read = staticmethod(written.__getitem__)

    loads, verifies = [], []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        VersionedState(key_fields, value_fields).load(Source, 11)
        loads.append(time.perf_counter() - t0)
        t0 = time.perf_counter()   # decoding is verifying: the Arrow read is zero-copy
        for name in chain:
            decoding.decode(f"bench/{name}", "bench", written[name], state.schema,
                            read_columns=columns_reader(Source, list(written)))
        verifies.append(time.perf_counter() - t0)
    load_ms, verify_ms = statistics.median(loads) * 1000, statistics.median(verifies) * 1000
    print(json.dumps({"case": "state_load", "state_rows": n, "files": chain,
                      "bytes": sum(len(written[c]) for c in chain), "runs": args.runs,
                      "load_ms_median": round(load_ms, 1),
                      "verify_ms_median": round(verify_ms, 1),
                      "verify_share_of_load": round(verify_ms / load_ms, 4)}), flush=True)
