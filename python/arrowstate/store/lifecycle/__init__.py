"""The lifecycle of one partition's files: which files load a version, loading it, when a
snapshot is made and how it ships, and which files retention lets go.

- `sources`: the partition's files as a load reads them (`FileSource`), and its columns
  files read once each;
- `chains`: which chains of files (a snapshot, then deltas) give a version, and the error
  naming what is missing when none does;
- `loading`: loading a version into a state from the first sound chain;
- `snapshots`: encoding a snapshot (rows, or a manifest of runs) in a thread;
- `maintenance`: `Lifecycle`, what each commit writes and prunes: snapshot scheduling,
  shipping and retention.

Checkpoint format v2's lineage is `store.lineage`.
"""
