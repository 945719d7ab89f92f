"""The versioned state of one operator partition, held in memory between micro-batches.

Like Spark's state store, a task works on version V and commits V + 1 as a delta (the puts
and removes, in order). The rows live in `KeyedRows`, the family's expiry or timeout index in
a `TimeIndex`, the files' format in `files` and their lifecycle (load chain, snapshots,
retention) in `Lifecycle`; this class records the changes between them.
"""
from __future__ import annotations

import contextlib
import secrets
import sys
from typing import TYPE_CHECKING, Callable, Hashable, Iterator, NamedTuple, Sequence

import numpy as np
import pyarrow as pa

from .. import keys as keycodec
from . import evolution, files, manifest
from .hashed import HashedRows, available as hash_table_available
from .prefixed import PrefixedHashedRows
from .lifecycle import FileSource, Lifecycle, load_plans, schema_reader
from .rows import KeyedRows, sampled_size
from .tier import TieredRows
from .time_index import TimeIndex

if TYPE_CHECKING:
    from .budget import TierPlace


class CommitFiles(NamedTuple):
    """What committing a version writes: its delta, the schema file to write before it (name
    and bytes) when the partition lacks the one it needs, the files of snapshots (of earlier
    versions) made meanwhile (name, and bytes or a local file's path, in order), the version
    below which files may be pruned (-1: none), and the run files to delete once pruned."""
    version: int
    delta: bytes
    schema_file: tuple[str, bytes] | None
    snapshots: list
    prune_below: int
    delete: list

    def written(self) -> dict[str, bytes]:
        """The files the commit itself writes, by name, in order: the schema file, then the
        delta."""
        done = dict([self.schema_file]) if self.schema_file else {}
        done[files.file_name(files.DELTA, self.version)] = self.delta
        return done


class VersionedState:
    """Key -> Arrow row mapping with the changes since the last committed version."""

    def __init__(self, key_fields: Sequence[pa.Field], value_fields: Sequence[pa.Field],
                 named_columns: bool = False, dropped_columns: Sequence[str] = (),
                 tier: "TierPlace | None" = None, prefix_count: int = 0,
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
        schema are read in this one by `evolve(name, column, type)` (store.evolution).
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
        self.files_skipped = 0              # damaged snapshots passed over by the last load
        self._pending_uid: bytes | None = None
        # the schema files the partition holds (known since the load, or written since)
        self.schema_files: set[str] = set()
        self._pending_schema: str | None = None
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
        """Adds change records to this version's delta (no state: see `files`); `batch`
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
                     uid: bytes | None = None) -> CommitFiles:
        """The files of new_version's commit: its delta records the state `figures`, if
        given; a large delta's buffers are compressed with `codec`, a files.ipc_codec.
        `list_names`: the partition's files (a snapshot naming earlier run files checks
        they are there). `uid`: the delta's unique id (a checkpoint id), else a new one."""
        delta, self._pending_uid, schema_name = files.encode_delta(
            self.schema, new_version, self._changes, self._has_change_records, figures, codec,
            uid)
        schema_file = None
        if schema_name is not None and schema_name not in self.schema_files:
            schema_file = files.schema_file(self.schema)
            self._pending_schema = schema_name
        done = self.lifecycle.maintenance(new_version, min_versions_to_retain, list_names,
                                          self._held_run_files, len(delta))
        return CommitFiles(new_version, delta, schema_file, done.snapshots, done.prune_below,
                           done.delete)

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
        if self._pending_schema is not None:
            self.schema_files.add(self._pending_schema)
            self._pending_schema = None
        self._changes.clear()
        self._has_change_records = False
        self.rows.compact_if_sparse()
        self.lifecycle.committed(self.rows.frozen, self.schema, new_version,
                                 min_deltas_for_snapshot, snapshot_dir, codec, self.seeds)

    def load(self, source: FileSource, version: int, snapshot: int | None = None) -> None:
        """Loads `version`: the newest snapshot at or below it and the deltas after it. A
        damaged snapshot is passed over, with a warning naming it, for an older one (or none)
        and the deltas after that, as Spark's automatic snapshot repair does; a damaged or
        missing delta that every chain needs fails, naming it. With `snapshot`, only the
        chain from that snapshot is taken (Spark's readers' snapshotStartBatchId)."""
        names = source.names()
        plans, snapshots = load_plans(names, version, source.where, source.context, snapshot)
        damaged: list[int] = []
        read_schema = schema_reader(source, names)
        self.schema_files = {n for n in names if files.is_schema_file(n)}

        def decoded(name: str) -> tuple[list[pa.RecordBatch], bytes | None]:
            return files.decode(f"{source.where}/{name}", source.context, source.read(name),
                                self.schema, self.dropped_columns, self.evolve, read_schema)

        # a tier merges whole as it loads (no micro-batches to pace its merges over)
        with (self.rows.unpaced() if isinstance(self.rows, TieredRows)
              else contextlib.nullcontext()):
            for chain, base in plans:
                self.rows.clear()
                try:
                    uid = self._load_base(source, chain[0], names, decoded)
                except files.CorruptStateFile as e:
                    if not base:
                        raise
                    damaged.append(base)
                    last_damage = e
                    print(f"arrowstate: WARN skipping damaged snapshot {e.path} "
                          f"({source.context}): {e.what}; loading from an older snapshot and "
                          "the deltas after it", file=sys.stderr, flush=True)
                    continue
                for name in chain[1:]:   # each file is verified whole before it is applied
                    batches, uid = decoded(name)
                    for batch in batches:
                        self._apply(batch)
                self.lifecycle.loaded(snapshots, base, damaged,
                                      self._manifests(source, names, snapshots, damaged))
                self.version = version
                self.last_uid = uid if chain[-1].endswith(files.SUFFIX[files.DELTA]) else None
                self.files_skipped = len(damaged)
                self._changes.clear()
                self._has_change_records = False
                return
        raise files.CorruptStateFile(
            last_damage.path, source.context,
            f"{last_damage.what}; every snapshot that could load version {version} is damaged "
            f"({', '.join(map(str, damaged))}) and no chain of deltas alone reaches it")

    def _load_base(self, source: FileSource, name: str, names: list[str],
                   decoded) -> bytes | None:
        """Applies the first file of a load's chain (a snapshot, a manifest and its run
        files, or the first delta); its unique id (None for a manifest)."""
        payload = source.read(name)
        path = f"{source.where}/{name}"
        made = (manifest.read(path, source.context, payload)
                if name.endswith(files.SUFFIX[files.SNAPSHOT]) else None)
        if made is None:
            batches, uid = decoded(name)
            for batch in batches:
                self._apply(batch)
            return uid
        present = set(names)

        def run_batches(piece: manifest.Piece) -> list[pa.RecordBatch]:
            return manifest.run_batches(
                source.where, source.context, path, piece, present, source.read, self.schema,
                lambda p, data: files.decode(p, source.context, data, self.schema,
                                             self.dropped_columns, self.evolve))

        if not isinstance(self.rows, TieredRows):   # state in memory: the runs in order
            for run in made.runs:
                for piece in run:
                    for batch in run_batches(piece):
                        self._apply(batch)
            return None
        self.seeds = made.seeds   # the runs' key order follows the seeds that wrote them

        def entries(run: list[manifest.Piece]):
            for piece in run:
                for batch in run_batches(piece):
                    rows = pa.RecordBatch.from_arrays(batch.columns[:-1], schema=self.schema)
                    alive = batch.column(batch.num_columns - 1).to_numpy(
                        zero_copy_only=False) == files.OP_PUT
                    yield (self.keys(rows.columns[: self.key_count], rows.num_rows), alive,
                           rows)

        for run in made.runs:
            self.rows.adopt(entries(run), sum(p.rows for p in run), tuple(run),
                            lambda what: files.CorruptStateFile(
                                f"{source.where}/{run[0].name}", source.context, what))
        self.rows.set_live(made.rows)
        return None

    @staticmethod
    def _manifests(source: FileSource, names: list[str], snapshots: Sequence[int],
                   damaged: Sequence[int]) -> dict[int, frozenset[str]]:
        """The run files every manifest of the partition names (retention deletes a run
        file only when no snapshot it keeps names it). A snapshot's last bytes say whether
        it is one; a damaged manifest is passed over (it loads nothing: its run files need
        not stay for it)."""
        found: dict[int, frozenset[str]] = {}
        if not any(files.is_run_file(n) for n in names):
            return found
        for version in snapshots:
            if version in damaged:
                continue
            name = files.file_name(files.SNAPSHOT, version)
            if not manifest.is_manifest(source.tail(name, files.TRAILER.size)):
                continue
            try:
                made = manifest.read(f"{source.where}/{name}", source.context,
                                     source.read(name))
            except files.CorruptStateFile:
                continue
            if made is not None:
                found[version] = frozenset(made.names())
        return found

    def _apply(self, batch: pa.RecordBatch) -> None:
        """Replays a file batch: runs of puts and removes, in order (change records are
        no state)."""
        for op, run in files.op_runs(batch):
            if op not in (files.OP_PUT, files.OP_REMOVE):
                continue
            run = pa.RecordBatch.from_arrays(run.columns[:-1], schema=self.schema)
            run_keys = self.keys(run.columns[: self.key_count], run.num_rows)
            if op == files.OP_PUT:
                self.rows.insert(run_keys, run)
            else:
                self.rows.discard(run_keys, run)

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
