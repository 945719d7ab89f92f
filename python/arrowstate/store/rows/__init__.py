"""A partition's rows in memory, found by key (a `versions.versioned.VersionedState` keeps
its rows in one of these, or in the `tier`):

- `keyed`: `KeyedRows`, a dict of Python key values (keys of any kind), and the memory
  estimates of Python values;
- `hashed`: `HashedRows`, fixed-width keys in a hash table in compiled code;
- `prefixed`: `PrefixedHashedRows`, the hash table with the rows of a key prefix found
  together (session windows);
- `chunks`: the Arrow row storage they share, read by row id.
"""
