"""One partition's versioned state, held in memory between micro-batches.

- `versioned`: `VersionedState`, its rows, the changes of the version being made and what
  committing it writes;
- `time_index`: keys ordered by the time they expire (a family's eviction and timeouts).
"""
