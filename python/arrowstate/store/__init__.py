"""State held by the Python worker, read by its folders:

- `formats/`: the state files' formats (names, layout, writing, reading, compact deltas and
  their columns files, manifests, schema evolution);
- `rows/`: a partition's rows in memory (a dict, a hash table, a hash table by prefix);
- `tier/`: rows in sorted runs that may live on local disk, their merges and filters;
- `versions/`: one partition's versioned state (its rows, changes, commits) and time index;
- `lifecycle/`: which files load a version, loading it, snapshots and retention;
- `lineage`: checkpoint format v2's lineage (a delta's checkpoint id, the check on a load);
- `held/`: the states a worker holds between tasks, under its memory budget.

Each folder's `__init__` names its modules; modules are imported by their own paths.
"""
