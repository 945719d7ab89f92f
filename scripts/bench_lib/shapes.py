"""bench.py --shapes: the user-function cases over every shape of input, arrowstate against
its floor (bench_lib/floor.py): each key `r` times in every batch (r in --shape-rows-per-key),
for K keys (K in --shape-keys; shapes of more than --shape-max-batch-rows rows a batch are
left out). Per shape: both engines' rows/s, their ratio, and the cost per key and batch in
microseconds (the run's time over K x batches), so that a cost per key that grows with K
shows. Native Spark is left out here: at 1M keys its batches take minutes."""
from __future__ import annotations

import json
import shutil
import statistics
import tempfile


def shapes(spark, args, cases: dict, run_once, write_batches, floor_figures) -> None:
    rows_per_key = [int(r) for r in args.shape_rows_per_key.split(",")]
    key_counts = [int(k) for k in args.shape_keys.split(",")]
    for name in args.cases.split(","):
        warmed = False
        for r in rows_per_key:
            for keys in key_counts:
                if keys * r > args.shape_max_batch_rows:
                    continue
                source = tempfile.mkdtemp(prefix="bench-shape-")
                try:
                    rows = keys * r * args.batches
                    write_batches(source, rows, args.batches, keys, rows_per_key=r)
                    # the JIT settling and the workers' start, once a case (--warmup),
                    # for arrowstate and the floor's Spark runs alike
                    warmup = 0 if warmed else args.warmup
                    for _ in range(warmup):
                        run_once(spark, source, cases[name], True)
                    warmed = True
                    ours = statistics.median(run_once(spark, source, cases[name], True)[0]
                                             for _ in range(args.runs))
                    shape_args = type(args)(**{**vars(args), "rows": rows, "warmup": warmup})
                    floor = floor_figures(spark, source, name, shape_args)
                    per_key = 1e6 / (keys * args.batches)
                    print(json.dumps({
                        "case": name, "rows_per_key_per_batch": r, "keys": keys,
                        "batches": args.batches, "rows": rows, "runs": args.runs,
                        "arrowstate_rows_per_s": round(rows / ours),
                        "floor_rows_per_s": round(rows / floor["floor_s"]),
                        "arrowstate_vs_floor": round(floor["floor_s"] / ours, 3),
                        "arrowstate_us_per_key_batch": round(ours * per_key, 2),
                        "floor_us_per_key_batch": round(floor["floor_s"] * per_key, 2),
                        "arrowstate_s": round(ours, 2), **floor}), flush=True)
                finally:
                    shutil.rmtree(source, ignore_errors=True)
