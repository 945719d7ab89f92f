"""The tier: rows with fixed-width keys in sorted runs that may live on local disk, so
state may outgrow a worker's memory budget.

- `tiered`: `TieredRows`, the rows in runs (lookups, puts, removals, spills), and
  `TierPlace`, where a partition's tier keeps its files;
- `runs`: one run, in memory or its files on disk, and reading it;
- `run_writer`: writing a run's files;
- `merging`: merging runs in key order, at once or paced a step at a time in a thread;
- `schedule`: which runs merge, and when (size classes, pacing);
- `bloom`: the Bloom filter of a run's keys.
"""
