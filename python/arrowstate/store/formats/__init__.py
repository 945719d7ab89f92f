"""The state files' formats, each file's bytes and names; nothing here holds state.

- `names`: which name a version's delta or snapshot has, and what kind of file a name is;
- `files`: the layout of formats 1 to 4 (documented there), op codes and metadata keys;
- `container`: the 60-byte trailer every file since format 2 ends with, and the error a
  file that fails it raises (`CorruptStateFile`);
- `encoding`: writing a delta or snapshot (to bytes, or to a local file a batch at a time);
- `decoding`: reading a file, verified whole before any of it is used;
- `compact`: format 4, small deltas that name their partition's columns file (an Arrow
  schema of ours, not Spark's state schema file);
- `manifest`: format 5, snapshots that name the tier's run files;
- `evolution`: state written in an older schema, read in the query's as Spark reads it.
"""
