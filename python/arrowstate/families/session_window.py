"""Session window aggregation state, as Spark's SessionWindowStateStoreRestoreExec +
SessionWindowStateStoreSaveExec pair (state format 1, StreamingSessionWindowStateManager).

Spark's own MergingSessionsExec runs in the JVM between the two and merges overlapping
sessions and their aggregation buffers; this family keeps each key's sessions. A stored row is
Spark's: key = the grouping keys without the session and the session's start, value = the
whole row (keys, session window, buffer), so Spark's state readers see Spark's layout.

- lookup (restore), per batch of input rows sorted by keys and session start (Spark's
  required ordering): rows whose event time is at or below the late-events watermark are
  dropped and counted; for the kept rows the answer says in which order they and the stored
  sessions of their keys follow each other, as Spark's MergingSortWithSessionWindowStateIterator
  orders them (by start, a stored session before an input row of the same start), with the
  stored sessions in it. The stored sessions of the batch's last key that start after its last
  row are held back: the key's rows may go on in the next batch. An empty batch (after the
  input) asks for them.
- process (save), the merged sessions, sorted by keys and start: per key, every session of it
  is stored (counted as updated, changed or not) and the stored sessions whose start is not
  among them are removed (counted), as Spark's `updateSessions` does. A key's sessions may
  span batches: a key is applied once its last session has come (the next key's, or END).
- finish: append mode removes and emits the sessions the eviction watermark closes (by the
  event-time column: the session's end); complete mode emits every stored session.
  Spark refuses update mode for session windows at analysis.

The sessions of each key are found together by a prefix scan on the grouping keys, as
Spark's RocksDB store finds them: in the tier's sorted runs (a worker with a memory budget)
or, without one, in the compiled hash table with a prefix index (store.rows.prefixed); with keys
of no fixed width, in memory by an index (`state.objects["sessions"]`: key -> the state
keys of its sessions by start, gathered and replaced a batch at a time in C-level maps
rather than a Python loop per row). In append mode a time index holds each session at or
before its event time (its end, which only grows), so eviction touches only what the
watermark passes; the stored session's own event time decides (an entry whose session has
been merged away is skipped, one whose session was extended enters it again at its end).
"""
from __future__ import annotations

import itertools
from typing import Any, Hashable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import keys as keycodec
from ..keys import prefixes
from ..spark_state.session_window import LAYOUT
from ..store.rows.keyed import KeyedRows
from ..store.versions.versioned import VersionedState
from .base import WATERMARK_METRICS, FamilyBase

_NONE = object()   # no key looked up yet in this task
# evicted sessions left in the index of each key's sessions before it is built again (when
# they also outnumber the live ones): a rebuild reads every row
_MIN_EVICTED_FOR_REBUILD = 65536


def _micros(arr: pa.Array) -> np.ndarray:
    return pc.fill_null(arr.view(pa.int64()), 0).to_numpy(zero_copy_only=False)


class SessionWindow(FamilyBase):
    name = "sessionWindow"
    layout = LAYOUT
    # every batch saves its keys' sessions again and evicts many: sorted runs (Arrow's hash
    # table for membership) cost about 40% less Python time than the dict per session, and
    # the compiled hash table with a prefix index (store.rows.prefixed) about a third less than runs
    runs_without_budget = True
    hashed_keys = True

    def __init__(self, operator: dict[str, Any], input_schema: pa.Schema):
        super().__init__(operator, WATERMARK_METRICS)
        self.key_indexes: list[int] = list(operator["keyIndexes"])
        self.session_index: int = operator["sessionIndex"]
        self.event_time_index: int = operator["eventTimeIndex"]   # in the row, or -1
        self.output_mode: str = operator["outputMode"]
        self.batch_size = max(1, int(operator["batchSize"]))
        if self.output_mode not in ("append", "complete"):
            raise ValueError(f"arrowstate: session windows run in append and complete mode, "
                             f"not {self.output_mode} (Spark refuses it too)")
        fields = list(input_schema)
        self.group_width = len(self.key_indexes)
        start_type = fields[self.session_index].type.field(0).type
        self.key_fields = ([fields[i] for i in self.key_indexes]
                           + [pa.field("sessionStartTime", start_type)])
        self.value_fields = fields
        self.key_count = len(self.key_fields)
        if self.event_time_index < 0:   # Spark drops and evicts nothing then
            self.late_threshold = self.evict_threshold = None
        if self.output_mode != "append":
            self.evict_threshold = None
        self.indexed = self.event_time_index >= 0 and self.output_mode == "append"
        # on the tier, the grouping keys are the state key's prefix (none: one group)
        self.prefix_count = self.group_width
        self.tiered = self.group_width > 0
        # the lookup batch: keys, session, and the event-time column if it is another one
        self.lookup_event_time = (None if self.event_time_index < 0 else
                                  self.group_width if self.event_time_index == self.session_index
                                  else self.group_width + 1)
        # restore: the key looked up last, and its stored sessions held back
        self._last_group: Any = _NONE
        self._carry: pa.RecordBatch | None = None
        # save: the key whose sessions may go on in the next batch
        self._pending: list[pa.RecordBatch] = []
        self._pending_keys: list[Hashable] = []
        # the stored sessions this task's restore handed over (state in memory): saved
        # again, they keep the time index entry they have
        self._handed_over: set[Hashable] = set()
        # on the tier, the task's changes, made at its end in one removal and one put: a run
        # each rather than two per batch the save gets, so fewer runs to merge. The state
        # does not change until then, so the row ids of the removed sessions stay valid
        self._tier_changes: dict[str, list] = {"gone_keys": [], "gone_ids": [], "keys": [],
                                               "rows": [], "stored": []}
        # on the tier, the stored sessions the task's restore found (each one's grouping key
        # prefix, state key and row id): the save finds its keys' stored sessions among them
        # rather than scanning again (every key the save gets was looked up by the restore)
        self._restored: dict[str, list] = {"prefixes": [], "keys": [], "ids": []}

    # -- the index of each key's sessions ---------------------------------------------------
    def rebuild_index(self, state: VersionedState) -> None:
        if _scanned(state):
            if self.indexed:
                for keys, rows in state.items(1 << 20):
                    self._index_times(state, keys, rows.columns[self.key_count:])
            return
        state_keys, values = self._index_sessions(state)
        if self.indexed:
            self._index_times(state, state_keys, values)

    def _index_sessions(self, state: VersionedState) -> tuple[list, list]:
        """Builds the index of each key's sessions from the rows (state in memory); returns
        the state keys and value columns read."""
        state_keys, live = state.live_items()
        values = live.columns[self.key_count:]
        n = len(state_keys)
        groups = keycodec.rows([values[i] for i in self.key_indexes], n)
        codes: dict[Hashable, int] = {}   # each key's first place: orders keys, not values
        code = np.fromiter(map(codes.setdefault, groups, itertools.count()), np.int64, n)
        order = np.lexsort((_micros(values[self.session_index].flatten()[0]), code))
        state.objects = {"sessions": _by_group(state.pick(groups, order),
                                               state.pick(state_keys, order)),
                         "evicted": 0}
        return state_keys, values

    def _sessions(self, state: VersionedState) -> dict:
        """Key -> the state keys of its sessions, by start (state in memory). Evicted
        sessions stay in it (they are looked up, not found) until the key's sessions are
        next saved, or until they outnumber the live ones and the index is built again."""
        if "sessions" not in (state.objects or {}):
            self._index_sessions(state)
        return state.objects["sessions"]

    def _index_times(self, state: VersionedState, state_keys, values: list) -> None:
        """Enters sessions in the time index at their event time. An entry is checked
        against the stored session when it comes up (`_evict`)."""
        times, valid = keycodec.event_time_micros(values[self.event_time_index])
        state.index.add_many(times, state_keys, valid)

    # -- restore ----------------------------------------------------------------------------
    def lookup(self, state: VersionedState, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        with self.updating():
            return self._restore(state, batch)

    def _groups(self, state: VersionedState, columns: list, n: int):
        """Each row's grouping key: a Python value, or on the tier its prefix bytes."""
        if _scanned(state):
            return state.prefix_keys(columns, n)
        return keycodec.rows(columns, n)

    def _stored_of(self, state: VersionedState, groups: list) -> tuple[pa.RecordBatch, list]:
        """The stored sessions of these keys, each key's by start: their value columns and
        the number per key."""
        if _scanned(state):
            prefixes = np.asarray(groups, state.prefix_dtype)
            owner, ids = state.scan_prefixes(prefixes)
            rows = state.take(ids)
            restored = self._restored
            restored["prefixes"].append(prefixes[owner])
            restored["keys"].append(state.keys_of_rows(ids, rows))
            restored["ids"].append(ids)
            order = _stable_order(owner, _micros(rows.column(self.key_count - 1)))
            return (pa.RecordBatch.from_arrays(rows.take(pa.array(order)).columns[
                self.key_count:], schema=self._value_schema()),
                np.bincount(owner, minlength=len(groups)))
        held = list(map(self._sessions(state).get, groups, itertools.repeat(())))
        counts = np.fromiter(map(len, held), np.int64, len(held))
        picked = list(itertools.chain.from_iterable(held))
        ids = state.lookup(picked)
        found = ids >= 0
        if self.indexed:
            self._handed_over.update(itertools.compress(picked, found.tolist()))
        if not found.all():   # evicted since the key's sessions were saved
            counts = np.bincount(np.repeat(np.arange(len(held)), counts)[found],
                                 minlength=len(held))
            ids = ids[found]
        rows = state.take(ids)
        return pa.RecordBatch.from_arrays(rows.columns[self.key_count:],
                                          schema=self._value_schema()), counts

    def _empty(self) -> pa.RecordBatch:
        return pa.RecordBatch.from_pylist([], schema=self._value_schema())

    def _value_schema(self) -> pa.Schema:
        return pa.schema([pa.field(f"v{i}", f.type) for i, f in enumerate(self.value_fields)])

    def _restore(self, state: VersionedState, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        n = batch.num_rows
        if n == 0:   # after the input: the held-back sessions of the last key
            carry, self._carry = self._carry, None
            if carry is None or carry.num_rows == 0:
                return None
            return self._answer(np.full(carry.num_rows, -1, np.int32), carry,
                                np.arange(carry.num_rows))
        g = self.group_width
        starts = _micros(batch.column(g).flatten()[0])
        kept = np.arange(n)
        late_any = False
        if self.late_threshold is not None:
            late = self.late_mask(*keycodec.event_time_micros(
                batch.column(self.lookup_event_time)))
            if late.any():
                late_any = True
                kept = np.flatnonzero(~late)
        group_of = self._groups(state, batch.columns[:g], n)
        runs, run_of = _runs(group_of, kept)
        if not runs:   # every row late: held-back sessions keep waiting
            return self._answer(np.zeros(0, np.int32), self._empty(), np.zeros(0))

        parts: list[pa.RecordBatch] = []   # stored rows: held back ones, then per key
        part_runs: list[np.ndarray] = []   # each stored row's run (-1: before every run)
        carry = self._carry
        if carry is not None and runs[0] != self._last_group:
            self._carry = None           # the last key's rows ended with the last batch
            parts.append(carry)
            part_runs.append(np.full(carry.num_rows, -1))
        continues = runs[0] == self._last_group
        looked_up = runs[1:] if continues else runs
        if continues:
            held, self._carry = self._carry, None
            if held is not None:
                parts.append(held)
                part_runs.append(np.zeros(held.num_rows, np.int64))
        if looked_up:
            stored, counts = self._stored_of(state, looked_up)
            if stored.num_rows:
                parts.append(stored)
                part_runs.append(np.repeat(np.arange(len(looked_up)) + int(continues), counts))
            self._last_group = looked_up[-1]
        if not parts and not late_any:
            return None                  # the batch as it is
        stored = (pa.concat_batches(parts) if len(parts) > 1 else parts[0]) if parts \
            else self._empty()
        stored_runs = np.concatenate(part_runs) if part_runs else np.zeros(0, np.int64)
        stored_starts = _micros(stored.column(self.session_index).flatten()[0])
        # the last key's sessions after its last row here wait for its next rows
        wait = (stored_runs == len(runs) - 1) & (stored_starts > starts[kept[-1]])
        take_stored = np.arange(stored.num_rows)
        if wait.any():
            self._carry = stored.filter(pa.array(wait))
            take_stored = np.flatnonzero(~wait)
            stored_runs, stored_starts = stored_runs[take_stored], stored_starts[take_stored]

        m = len(take_stored)
        # by key and start; on a tie the stored session first, then as they came: a stable
        # sort of the stored rows followed by the input rows
        order = _stable_order(np.concatenate([stored_runs, run_of]),
                              np.concatenate([stored_starts, starts[kept]]))
        pos = np.concatenate([np.full(m, -1, np.int32), kept.astype(np.int32)])[order]
        take = np.concatenate([take_stored, np.full(len(kept), -1)])[order]
        return self._answer(pos, stored, take)

    def _answer(self, pos: np.ndarray, stored: pa.RecordBatch, take: np.ndarray
                ) -> pa.RecordBatch:
        """The restore's answer: per output row the input row's position (-1: a stored
        session) and the stored session's columns (null for input rows)."""
        take = np.asarray(take, np.int64)
        values = stored.take(pa.array(take, mask=take < 0))
        return pa.RecordBatch.from_arrays(
            [pa.array(pos, pa.int32())] + values.columns,
            names=["pos"] + [f"v{i}" for i in range(values.num_columns)])

    # -- save -------------------------------------------------------------------------------
    def process(self, state: VersionedState, batch: pa.RecordBatch) -> None:
        with self.updating():
            n = batch.num_rows
            if n == 0:
                return None
            groups = self._groups(state, [batch.column(i) for i in self.key_indexes], n)
            last = groups[-1]
            cut = n   # the rows from here on are the last key's: its sessions may go on
            while cut > 0 and groups[cut - 1] == last:
                cut -= 1
            if self._pending and groups[0] != self._pending_keys[-1]:
                self._apply_pending(state)
            if cut > 0:
                self._pending.append(batch.slice(0, cut))
                self._pending_keys.extend(groups[:cut])
                self._apply_pending(state)
            self._pending.append(batch.slice(cut))
            self._pending_keys.extend(groups[cut:])
        return None

    def _apply_pending(self, state: VersionedState) -> None:
        if not self._pending:
            return
        rows = (pa.concat_batches(self._pending) if len(self._pending) > 1
                else self._pending[0])
        groups = self._pending_keys
        self._pending, self._pending_keys = [], []
        self._replace(state, rows, groups)

    def _replace(self, state: VersionedState, rows: pa.RecordBatch, groups: list) -> None:
        """Each key's sessions become the given ones: Spark's `updateSessions` per key."""
        n = rows.num_rows
        if n == 0:
            return
        start_column = rows.column(self.session_index).flatten()[0]
        key_columns = [rows.column(i) for i in self.key_indexes] + [start_column]
        if _scanned(state):
            self._replace_scanned(state, rows, key_columns)
            return
        state_keys = keycodec.rows(key_columns, n)
        firsts = _run_starts(groups)
        run_groups = state.pick(groups, firsts)
        sessions = self._sessions(state)
        kept = set(state_keys)
        removed = list(itertools.filterfalse(kept.__contains__, itertools.chain.from_iterable(
            map(sessions.get, run_groups, itertools.repeat(())))))
        sessions.update(zip(run_groups, _split(state_keys, firsts)))
        if removed:
            self.metrics["numRemovedStateRows"] += state.pop_present(removed).num_rows
        state.put_rows(state_keys, pa.RecordBatch.from_arrays(
            key_columns + rows.columns, schema=state.schema))
        self.metrics["numUpdatedStateRows"] += n
        if self.indexed:
            # a session handed over keeps its entry (at or before its end, which only
            # grows: a merge keeps the stored session in it); the others get one
            stored = np.fromiter(map(self._handed_over.__contains__, state_keys), bool, n)
            times, valid = keycodec.event_time_micros(rows.column(self.event_time_index))
            state.index.add_many(times, state_keys, valid & ~stored)

    def _replace_scanned(self, state: VersionedState, rows: pa.RecordBatch,
                         key_columns: list) -> None:
        """`_replace` on the tier: each key's stored sessions are those the restore found by
        prefix scan (taken out of what it found: that stays as small as what the restore is
        ahead of the save)."""
        n = rows.num_rows
        new_keys = state.keys(key_columns, n)
        restored = self._restored
        for parts in restored.values():   # joined once per restore call
            if len(parts) > 1:
                parts[:] = [np.concatenate(parts)]
        if restored["ids"]:
            # a key's first bytes are its prefix: the grouping keys' own encoding
            mine = keycodec.is_in(restored["prefixes"][0],
                                  prefixes(new_keys, state.prefix_dtype.itemsize))
            old_keys, ids = restored["keys"][0][mine], restored["ids"][0][mine]
            for parts in restored.values():
                parts[0] = parts[0][~mine]
        else:
            old_keys, ids = new_keys[:0], np.zeros(0, np.int64)
        # which saved sessions are stored (the prefix scan saw every stored one, each once)
        # and which stored ones are not saved again: one hash table of the stored keys
        at = keycodec.index_in(new_keys, old_keys)
        stored = at >= 0
        gone = np.ones(len(old_keys), bool)
        gone[at[stored]] = False
        changes = self._tier_changes
        changes["gone_keys"].append(old_keys[gone])
        changes["gone_ids"].append(ids[gone])
        changes["keys"].append(new_keys)
        changes["rows"].append(pa.RecordBatch.from_arrays(key_columns + rows.columns,
                                                          schema=state.schema))
        changes["stored"].append(stored)
        self.metrics["numRemovedStateRows"] += int(gone.sum())
        self.metrics["numUpdatedStateRows"] += n
        if self.indexed:   # as in memory: a session stored before keeps its entry
            times, valid = keycodec.event_time_micros(rows.column(self.event_time_index))
            state.index.add_many(times, new_keys, valid & ~stored)

    def _apply_tier_changes(self, state: VersionedState) -> None:
        """Makes the task's changes on the tier: the sessions merged away removed, then the
        saved ones put (the keys of the two never meet: a removed key is no saved one of its
        key's, and each key's sessions come in one save)."""
        changes = self._tier_changes
        if not changes["keys"]:
            return
        joined = {name: np.concatenate(parts) for name, parts in changes.items()
                  if name != "rows"}
        rows = pa.concat_batches(changes["rows"])
        for parts in changes.values():
            parts.clear()
        if len(joined["gone_keys"]):
            state.pop_found(joined["gone_keys"], joined["gone_ids"])
        state.put_rows(joined["keys"], rows, joined["stored"])

    # -- after the input --------------------------------------------------------------------
    def finish(self, state: VersionedState) -> Iterator[pa.RecordBatch]:
        with self.updating():
            self._apply_pending(state)
            self._apply_tier_changes(state)
        if self.output_mode == "complete":
            self.close_timings()
            for rows in state.all_rows(self.batch_size):
                yield pa.RecordBatch.from_arrays(rows.columns[self.key_count:],
                                                 schema=self._value_schema())
            return
        with self.removing():
            evicted = self._evict(state)
        self.close_timings()
        if evicted is not None:
            for lo in range(0, evicted.num_rows, self.batch_size):
                yield evicted.slice(lo, self.batch_size)

    def _evict(self, state: VersionedState) -> pa.RecordBatch | None:
        """Removes the sessions whose event time the eviction watermark passed; their rows."""
        if self.evict_threshold is None:
            return None
        threshold = self.evict_threshold
        entries, _ = state.index.pop_until(threshold)
        # the stored session's own event time decides: entries of sessions merged away or
        # evicted already are passed over (a repeated one removes once), and a session
        # extended since its entry is entered again at its end
        keys = (keycodec.unique(np.asarray(entries, state.key_dtype)) if _scanned(state)
                else entries)
        ids = state.lookup(keys)
        found = np.flatnonzero(ids >= 0)   # once each, by row id (the order emitted in)
        found = found[np.unique(ids[found], return_index=True)[1]]
        rows = state.take(ids[found])   # read once: their times, and the output
        times, valid = keycodec.event_time_micros(rows.column(
            self.key_count + self.event_time_index))
        closing, later = valid & (times <= threshold), valid & (times > threshold)
        state.index.add_many(times[later], state.pick(keys, found[later]))
        evicted, closed = rows.filter(pa.array(closing)), found[closing]
        state.remove_read(state.pick(keys, closed), ids[closed], evicted)
        self.metrics["numRemovedStateRows"] += evicted.num_rows
        objects = state.objects
        if evicted.num_rows and objects and "sessions" in objects:   # in memory, indexed
            objects["evicted"] += evicted.num_rows
            if objects["evicted"] > max(len(state), _MIN_EVICTED_FOR_REBUILD):
                del objects["sessions"]   # built again from the live rows when next needed
        return pa.RecordBatch.from_arrays(evicted.columns[self.key_count:],
                                          schema=self._value_schema())


def _run_starts(keys) -> np.ndarray:
    """Where each run of equal keys begins, in a list of keys (compared in numpy's loop
    over objects, not a Python one) or an array of them."""
    n = len(keys)
    values = keys if isinstance(keys, np.ndarray) else np.fromiter(keys, object, n)
    first = np.ones(n, bool)
    first[1:] = values[1:] != values[:-1]
    return np.flatnonzero(first)


def _split(items: list, firsts: np.ndarray) -> Iterator[tuple]:
    """The runs of a list that begin at `firsts`, as tuples."""
    bounds = firsts.tolist() + [len(items)]
    return map(tuple, map(items.__getitem__, map(slice, bounds[:-1], bounds[1:])))


def _by_group(groups: list, state_keys: list) -> dict[Hashable, tuple]:
    """Key -> the state keys of its sessions, from both sorted by key and start."""
    firsts = _run_starts(groups)
    return dict(zip(KeyedRows.pick(groups, firsts), _split(state_keys, firsts)))


def _runs(group_of, kept: np.ndarray) -> tuple[list, np.ndarray]:
    """The keys of the kept rows (sorted by key), once each in order, and each kept row's
    index among them."""
    if isinstance(group_of, np.ndarray):   # prefix bytes
        kept_groups = group_of[kept]
        firsts = _run_starts(kept_groups)
        runs = list(kept_groups[firsts])
    else:
        kept_groups = KeyedRows.pick(group_of, kept)
        firsts = _run_starts(kept_groups)
        runs = KeyedRows.pick(kept_groups, firsts)
    step = np.zeros(len(kept), np.int64)
    step[firsts[1:]] = 1
    return runs, np.cumsum(step)


def _stable_order(runs: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The stable order by (run, start) of run numbers (-1 and up) and microseconds: one
    sort of both packed into one int64 where they fit (where they come as two sorted runs,
    numpy's stable sort merges them), else numpy's lexsort of the two."""
    if not len(runs):
        return np.zeros(0, np.int64)
    low = int(starts.min())
    shift = (int(starts.max()) - low).bit_length()
    if (int(runs.max()) + 1).bit_length() + shift <= 62:
        return np.argsort(((runs + 1) << shift) | (starts - low), kind="stable")
    return np.lexsort((starts, runs))


def _scanned(state: VersionedState) -> bool:
    """Whether the state is on the tier, its sessions found by prefix scan."""
    return state.prefix_dtype is not None
