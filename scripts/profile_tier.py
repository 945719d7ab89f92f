"""Where one state partition's tier spends a micro-batch, for a developer: the scaling
bench's workload (new keys each batch, a count and a sum per key) driven into one
partition's state in this process, as the worker drives it, with snapshots made every
--min-deltas versions (their files deleted once made, as the JVM does once it copied them).
Prints one JSON line per batch: the task thread's seconds to look the keys up, store them
and encode the commit; the seconds the merge step and the snapshot's thread still took
after it (waited for here, where the worker lets them run beside the next task); the
process's CPU seconds for the batch (threads included); the runs and paced merges held;
the MB of snapshot files shipped and of the delta.

    python scripts/profile_tier.py --state-keys 25000000 --batch-rows 500000
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import numpy as np
import pyarrow as pa

from arrowstate.store.tier.tiered import TierPlace
from arrowstate.store.versions.versioned import VersionedState


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--state-keys", type=int, default=25_000_000)
    parser.add_argument("--batch-rows", type=int, default=500_000)
    parser.add_argument("--min-deltas", type=int, default=10)
    parser.add_argument("--memory-cap-mb", type=int, default=64)
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="profile-tier-")
    state = VersionedState([pa.field("key", pa.int64())],
                           [pa.field("n", pa.int64()), pa.field("s", pa.float64())],
                           tier=TierPlace(directory + "/tier", args.memory_cap_mb << 20))
    rng = np.random.default_rng(1)
    rows = args.batch_rows
    try:
        for version in range(1, args.state_keys // rows + 1):
            keys = rng.permutation(rows).astype(np.int64) + version * rows
            batch = pa.RecordBatch.from_arrays(
                [pa.array(keys), pa.array(np.ones(rows, np.int64)), pa.array(rng.random(rows))],
                names=["k0", "v0", "v1"])
            cpu, t0 = time.process_time(), time.perf_counter()
            keys = state.keys([batch.column(0)], rows)
            present = state.lookup(keys) >= 0
            t1 = time.perf_counter()
            state.put_rows(keys, batch, present)
            t2 = time.perf_counter()
            done = state.commit_files(version, 1 << 30, None, "lz4", lambda: [])
            t3 = time.perf_counter()
            shipped = 0
            for _, content in done.snapshots:   # what the JVM copies, then deletes
                shipped += os.path.getsize(content)
                os.remove(content)
            state.mark_committed(version, args.min_deltas, directory + "/snapshots", "lz4")
            t4 = time.perf_counter()
            if state.rows.merges.stepper is not None:
                state.rows.merges.stepper.join()
            state.lifecycle.wait_for_snapshot()
            t5 = time.perf_counter()
            print(json.dumps({
                "version": version, "keys": len(state), "lookup_s": round(t1 - t0, 3),
                "store_s": round(t2 - t1, 3), "commit_s": round(t3 - t2 + t4 - t3, 3),
                "beside_next_task_s": round(t5 - t4, 3),
                "cpu_s": round(time.process_time() - cpu, 3), "runs": len(state.rows.runs),
                "paced_merges": len(state.rows.merges.paced),
                "snapshot_mb": round(shipped / 1e6, 1),
                "delta_mb": round(len(done.delta) / 1e6, 1)}), flush=True)
    finally:
        state.close()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
