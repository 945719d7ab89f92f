"""The versioned state of one operator partition, held in memory between micro-batches.

Like Spark's state store, a task works on version V and commits V + 1 as a delta (the puts
and removes, in order). The rows live in a store of `rows` (a dict, a hash table) or in the
`tier`, the family's expiry or timeout index in a `TimeIndex`, the files' format in
`formats` and their lifecycle (which files load a version, snapshots, retention) in
`lifecycle`; this class records the changes between them.
"""
from __future__ import annotations

import secrets
from typing import Callable, Hashable, Iterator, NamedTuple, Sequence

import numpy as np
import pyarrow as pa

from ... import keys as keycodec
from ..formats import compact, encoding, evolution, files
from ..formats.names import DELTA, checkpoint_uid, file_name
from ..lifecycle import snapshots
from ..lifecycle.loading import load_version
from ..lifecycle.maintenance import Lifecycle
from ..lifecycle.sources import FileSource
from ..rows.hashed import HashedRows, available as hash_table_available
from ..rows.keyed import KeyedRows, sampled_size
from ..rows.prefixed import PrefixedHashedRows
from ..tier.tiered import TieredRows, TierPlace
from .time_index import TimeIndex


class CommitFiles(NamedTuple):
    """What committing a version writes: its delta, the columns file to write before it
    (name and bytes) when the partition lacks the one it needs, the files of snapshots (of earlier
    versions) made meanwhile (name, and bytes or a local file's path, in order), the version
    below which files may be pruned (-1: none) once the snapshot file `prune_snapshot` is
    there, the run files to delete once pruned, the run files that stay (older others are
    orphans, `lifecycle.maintenance`), and the delta's name (under checkpoint format v2 it
    carries the attempt's checkpoint id)."""
    version: int
    delta: bytes
    columns_file: tuple[str, bytes] | None
    snapshots: list
    prune_below: int
    delete: list
    prune_snapshot: str
    keep_runs: list
    delta_name: str

    def written(self) -> dict[str, bytes]:
        """The files the commit itself writes, by name, in order: the columns file, then the
        delta."""
        done = dict([self.columns_file]) if self.columns_file else {}
        done[self.delta_name] = self.delta
        return done


class VersionedState:
    """Key -> Arrow row mapping with the changes since the last committed version."""

    def __init__(self, key_fields: Sequence[pa.Field], value_fields: Sequence[pa.Field],
                 named_columns: bool = False, dropped_columns: Sequence[str] = (),
                 tier: TierPlace | None = None, prefix_count: int = 0,
                 evolve=evolution.positional, hashed: bool = False):
        """With `named_columns` the files name each value column (the family's field name),
        and a load takes a file's columns by name: columns added since it was written come
        back null (a family whose set of value columns may grow between runs), and those
        named in `dropped_columns` (dropped on purpose) are left out. With `tier` (a worker
        with a memory budget) and keys of a fixed width, rows live in sorted runs that may
        move to local disk (`TieredRows`); else in memory (`KeyedRows`). `prefix_count`
        key fields (Spark's prefix key) then find their rows together (`prefix_keys`,
        `scan_prefixes`); a family that asks for `hashed` keys and a prefix has
        them, when the tier never spills (no budget), in a hash table in compiled code that
        finds them by prefix too (`PrefixedHashedRows`). Named columns written in an older
        schema are read in this one by `evolve(name, column, type)` (formats.evolution).
        With `hashed` (a family that handles keys only as `keys` makes them) and no tier or
        prefix, keys of a fixed width may move from the dict to a hash table in compiled
        code (`HashedRows`) once the state is large (`move_to_hash_table`)."""
        self.evolve = evolve
        self.dropped_columns = frozenset(n.encode() for n in dropped_columns)
        self.key_count = len(key_fields)
        fields = [pa.field(f"k{i}", f.type) for i, f in enumerate(key_fields)]
        fields += [pa.field(f"v{i}", f.type,
                            metadata={files.COLUMN_NAME: f.name.encode()} if named_columns
                            else None)
                   for i, f in enumerate(value_fields)]
        self.schema = pa.schema(fields)
        self.key_dtype = keycodec.key_dtype(key_fields) if tier is not None else None
        self.key_fields = list(key_fields)
        self._may_hash = hashed and tier is None and not prefix_count
        # strings in keys on the tier are hashed under seeds of this state's own (the tier
        # is never reused by another process, so they need not last)
        self.seeds = (secrets.randbits(64), secrets.randbits(64))
        self.prefix_dtype = None
        if self.key_dtype is not None and prefix_count:
            self.key_dtype = keycodec.bytes_dtype(key_fields)
            self.prefix_dtype = keycodec.bytes_dtype(key_fields[:prefix_count])
        self.rows: KeyedRows | HashedRows | TieredRows
        if self.key_dtype is None:
            self.rows = KeyedRows(self.schema)
        elif (hashed and self.prefix_dtype is not None and not tier.spills
              and hash_table_available()):   # in memory, found by prefix
            self.rows = PrefixedHashedRows(self.schema, self.key_dtype,
                                           self.prefix_dtype.itemsize)
        else:
            self.rows = TieredRows(self.schema, self.key_dtype, tier.directory,
                                   tier.memory_cap,
                                   self.prefix_dtype.itemsize if self.prefix_dtype else None)
        self.index = TimeIndex()   # the family's expiry/timeout index (rebuilt on load)
        # Python objects a family keeps with the state between batches (transformWithState's
        # decoded variables, timer heap and TTL heaps), rebuilt from the rows on a load
        self.objects: dict | None = None
        self.lifecycle = Lifecycle()
        self.version = 0
        self.run_id: str | None = None     # the query run that committed or loaded it
        self.last_uid: bytes | None = None  # unique id of the newest delta it committed
        # checkpoint format v2: the id of the attempt whose version this is, as Spark's
        # commit log records it (None under format v1, or where none is known)
        self.checkpoint_id: str | None = None
        self._pending_checkpoint_id: str | None = None
        self.files_skipped = 0              # damaged snapshots passed over by the last load
        self._pending_uid: bytes | None = None
        # the columns files the partition holds (known since the load, or written since)
        self.columns_files: set[str] = set()
        self._pending_columns: str | None = None
        self._changes: list[pa.RecordBatch] = []   # this version's puts and removes, in order
        self._has_change_records = False

    def __len__(self) -> int:
        return len(self.rows)

    def keys(self, columns: Sequence[pa.Array], num_rows: int):
        """The keys of rows of the key columns, in the form the rows' store takes: a list
        of Python values (KeyedRows) or a numpy array (HashedRows, TieredRows);
        `pick` selects."""
        if self.key_dtype is None:
            return keycodec.rows(columns, num_rows)
        return keycodec.key_array(columns, num_rows, self.key_dtype, self.seeds)

    def keys_of_rows(self, ids: np.ndarray, rows: pa.RecordBatch):
        """The keys of rows taken by id (`ids`, `rows`): the store's own where it keeps
        them in key form, else made from the rows' key columns."""
        if isinstance(self.rows, HashedRows):
            return self.rows.keys_at(ids)
        return self.keys(rows.columns[: self.key_count], rows.num_rows)

    def prefix_keys(self, columns: Sequence[pa.Array], num_rows: int) -> np.ndarray:
        """The prefixes (the first `prefix_count` key columns) of rows, in the form
        `scan_prefixes` takes (tiered state with a prefix only)."""
        return keycodec.key_array(columns, num_rows, self.prefix_dtype, self.seeds)

    def as_keys(self, keys):
        """Keys gathered one by one (from `keys`' results) in the store's form again."""
        if self.key_dtype is None or isinstance(keys, np.ndarray):
            return keys
        return np.asarray(keys, dtype=self.key_dtype)

    def close(self) -> None:
        """Lets go of what the state holds outside memory (the tier's files, a snapshot file
        not shipped)."""
        self.lifecycle.discard()
        self.rows.close()

    # -- reading ----------------------------------------------------------------------------
    def lookup(self, keys: Sequence[Hashable]) -> np.ndarray:
        """Each key's row id (keys as `keys` makes them), -1 where the key is absent."""
        return self.rows.lookup(keys)

    def take(self, ids: np.ndarray) -> pa.RecordBatch:
        """Rows by id (from `lookup` or `scan_prefixes`), in the order given."""
        return self.rows.take(ids)

    def pick(self, keys: Sequence[Hashable], positions) -> Sequence[Hashable]:
        """The keys at `positions` of keys as `keys` makes them, in that form."""
        return self.rows.pick(keys, positions)

    def scan_prefixes(self, prefixes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The live rows whose keys start with one of the prefixes (`prefix_keys`, unique):
        each row's prefix (its index in `prefixes`) and row id."""
        return self.rows.scan_prefixes(prefixes)

    def all_rows(self, batch_size: int) -> Iterator[pa.RecordBatch]:
        """Every live row, a batch at a time, as they are now (changes meanwhile do not
        disturb it)."""
        return self.rows.all_rows(batch_size)

    def items(self, batch_size: int) -> Iterator[tuple[Sequence[Hashable], pa.RecordBatch]]:
        """Every live key (as `keys` makes them) with its row, a piece at a time."""
        return self.rows.items(batch_size)

    def live_rows(self) -> pa.RecordBatch:
        """Every live row at once (state in memory: a dict or a hash table)."""
        return self.rows.take(self.rows.live_ids())

    def live_items(self) -> tuple[list, pa.RecordBatch]:
        """Every live key (as `keys` makes them) and row at once, in the same order (state
        in memory, in a dict)."""
        return list(self.rows.data), self.rows.take(self.rows.live_ids())

    # -- changing ---------------------------------------------------------------------------
    def put_rows(self, keys: Sequence[Hashable], batch: pa.RecordBatch,
                 present: np.ndarray | None = None) -> None:
        """Stores one row per key; `batch` holds the key then the value columns.
        `present`: whether each key is stored already, where the caller knows."""
        if len(keys) == 0:
            return
        batch = self._as_stored(batch)
        self.rows.insert(keys, batch, present)
        self._changes.append(files.with_op(batch, files.OP_PUT))

    def put_first_absent(self, keys: Sequence[Hashable], candidates: np.ndarray,
                         rows_of: Callable[[np.ndarray], pa.RecordBatch]
                         ) -> tuple[np.ndarray, Sequence[Hashable], pa.RecordBatch]:
        """Stores, for each key not in state, the row `rows_of` makes of its first position
        among `candidates` (ascending); returns those positions, their keys and rows."""
        if isinstance(self.rows, KeyedRows):   # the dict does both in fewer operations
            positions, new_keys, rows = self.rows.insert_first_absent(
                keys, candidates, lambda p: self._as_stored(rows_of(p)))
        else:
            positions = self.rows.first_absent(keys, candidates)
            new_keys = self.rows.pick(keys, positions)
            rows = self._as_stored(rows_of(positions))
            if len(new_keys):
                self.rows.insert(new_keys, rows)
        if len(new_keys):
            self._changes.append(files.with_op(rows, files.OP_PUT))
        return positions, new_keys, rows

    def _as_stored(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays(batch.columns, schema=self.schema)

    def pop_present(self, keys: Sequence[Hashable]) -> pa.RecordBatch:
        """Removes those of the keys that are present (repeats count once); returns their rows."""
        return self._removed(self.rows.pop_present(keys))

    def pop_found(self, keys: Sequence[Hashable], ids: np.ndarray) -> pa.RecordBatch:
        """Removes keys that `lookup` found (`ids`: their row ids; repeats count once);
        returns their rows."""
        return self._removed(self.rows.pop_found(keys, ids))

    def remove_read(self, keys: Sequence[Hashable], ids: np.ndarray,
                    rows: pa.RecordBatch) -> None:
        """Removes keys that `lookup` found (`ids`: their row ids, once each) whose rows
        the caller has read (`rows`, taken by those ids)."""
        self.rows.remove_found(keys, ids, rows)
        self._removed(rows)

    def _removed(self, rows: pa.RecordBatch) -> pa.RecordBatch:
        """Records removed rows in this version's delta; returns them."""
        if rows.num_rows:
            removed = rows.columns[: self.key_count] + [
                pa.nulls(rows.num_rows, f.type) for f in list(self.schema)[self.key_count:]]
            self._changes.append(files.with_op(
                pa.RecordBatch.from_arrays(removed, schema=self.schema), files.OP_REMOVE))
        return rows

    def record_changes(self, batch: pa.RecordBatch, ops: pa.Array) -> None:
        """Adds change records to this version's delta (no state: see `formats.files`); `batch`
        holds the key then the value columns, `ops` each row's files.CHANGE_* code."""
        if batch.num_rows:
            self._changes.append(pa.RecordBatch.from_arrays(
                batch.columns + [ops.cast(pa.int8())],
                names=self.schema.names + [files.OP_COLUMN]))
            self._has_change_records = True

    # -- versions ---------------------------------------------------------------------------
    def commit_files(self, new_version: int, min_versions_to_retain: int,
                     figures: dict | None = None, codec: str = "lz4",
                     list_names: Callable[[], list[str]] | None = None,
                     checkpoint_id: str | None = None) -> CommitFiles:
        """The files of new_version's commit: its delta records the state `figures`, if
        given; a large delta's buffers are compressed with `codec`, an encoding.ipc_codec.
        `list_names`: the partition's files (a snapshot naming earlier run files checks
        they are there). `checkpoint_id` (checkpoint format v2): the committing attempt's,
        in the delta's name and as its unique id, the delta recording the id of the version
        it builds on (`lineage`); else a new unique id and format v1's name."""
        uid = checkpoint_uid(checkpoint_id)
        base = None if checkpoint_id is None else checkpoint_uid(self.checkpoint_id)
        delta, self._pending_uid, columns_name = encoding.encode_delta(
            self.schema, new_version, self._changes, self._has_change_records, figures, codec,
            uid, base)
        self._pending_checkpoint_id = checkpoint_id
        columns_file = None
        if columns_name is not None and columns_name not in self.columns_files:
            columns_file = compact.columns_file(self.schema)
            self._pending_columns = columns_name
        done = self.lifecycle.maintenance(new_version, min_versions_to_retain, list_names,
                                          self._held_run_files, len(delta))
        return CommitFiles(new_version, delta, columns_file, done.snapshots, done.prune_below,
                           done.delete, done.prune_snapshot, done.keep_runs,
                           file_name(DELTA, new_version, checkpoint_id))

    def _held_run_files(self) -> set[str]:
        """The run files in the checkpoint that the tier's runs are (none off the tier)."""
        if not isinstance(self.rows, TieredRows):
            return set()
        return {p.name for run in self.rows.runs if run.pieces for p in run.pieces}

    def mark_committed(self, new_version: int, min_deltas_for_snapshot: int,
                       snapshot_dir: str | None = None, codec: str = "lz4") -> None:
        """The JVM wrote new_version's delta; a snapshot is made if one is due (as a file in
        `snapshot_dir`, else as bytes; compressed with `codec`)."""
        self.version = new_version
        self.last_uid = self._pending_uid
        self.checkpoint_id = self._pending_checkpoint_id
        if self._pending_columns is not None:
            self.columns_files.add(self._pending_columns)
            self._pending_columns = None
        self._changes.clear()
        self._has_change_records = False
        self.rows.compact_if_sparse()
        self.lifecycle.committed(self.rows.frozen, self.schema, new_version,
                                 min_deltas_for_snapshot, snapshot_dir, codec, self.seeds,
                                 self.checkpoint_id, self._snapshot_threaded)

    def _snapshot_threaded(self) -> bool:
        """Whether a snapshot due now is encoded in a thread (`lifecycle.snapshots`)."""
        return (isinstance(self.rows, TieredRows)
                or self.rows.memory_bytes() > snapshots.INLINE_MAX_BYTES)

    def snapshot_waits(self) -> bool:
        """Whether a small snapshot waits to be made (`lifecycle.snapshots`: the worker makes
        it once a task's answers went, with make_waiting_snapshot)."""
        return self.lifecycle.snapshot_waits()

    def make_waiting_snapshot(self) -> None:
        self.lifecycle.make_waiting_snapshot()

    def load(self, source: FileSource, version: int, snapshot: int | None = None,
             checkpoint_id: str | None = None) -> None:
        """Loads `version`: the newest sound snapshot at or below it and the deltas after it
        (`lifecycle.loading`); with `snapshot`, only the chain from that snapshot (Spark's
        readers' snapshotStartBatchId); with `checkpoint_id` (checkpoint format v2), the
        files of that attempt's lineage only (`lineage`)."""
        loaded = load_version(self, source, version, snapshot, checkpoint_id)
        self.version = version
        self.last_uid, self.files_skipped = loaded.last_uid, loaded.files_skipped
        self.checkpoint_id = checkpoint_id
        self.columns_files = loaded.columns_files
        self._changes.clear()
        self._has_change_records = False

    def move_to_hash_table(self, min_keys: int) -> bool:
        """Moves the rows from the dict to a hash table in compiled code (`HashedRows`: no
        Python object per key, about half the memory) once the state holds `min_keys`
        keys, for a state made with `hashed` whose keys have a fixed width. Between
        versions only (no change pending). True when it moved: the time index is then
        empty, for the family to rebuild from the rows (its keys change form)."""
        if (not self._may_hash or not isinstance(self.rows, KeyedRows)
                or len(self.rows) < min_keys or self._changes):
            return False
        dtype = keycodec.key_dtype(self.key_fields)
        if dtype is None or not hash_table_available():
            self._may_hash = False
            return False
        hashed = HashedRows(self.schema, dtype)
        for rows in self.rows.all_rows(1 << 20):
            hashed.insert(keycodec.key_array(rows.columns[: self.key_count], rows.num_rows,
                                             dtype, self.seeds), rows)
        self.rows, self.key_dtype = hashed, dtype
        self.index = TimeIndex()
        return True

    def memory_bytes(self) -> int:
        """Everything the state holds in memory: rows (or the tier's runs in memory, their
        Bloom filters and block index), the time index, and a family's own objects."""
        objects = sampled_size(self.objects) if self.objects else 0
        return self.rows.memory_bytes() + self.index.memory_bytes() + objects

    def disk_bytes(self) -> int:
        """The tier's files on local disk (0 for state held in memory)."""
        return self.rows.disk_bytes()
