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

The sessions of each key are found together: in memory by an index (`state.objects
["sessions"]`: key -> start -> (state key, event time)); in state on the tier (a worker with
a memory budget) by a prefix scan on the grouping keys, as Spark's RocksDB store finds
them. In append mode a time index holds each session at its
event time, so eviction touches only what the watermark passes (an entry whose session has
since been merged away or extended is skipped).
"""
from __future__ import annotations

from typing import Any, Hashable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import keys as keycodec
from ..store import VersionedState
from .base import WATERMARK_METRICS, FamilyBase
from .session_window_layout import LAYOUT

_NONE = object()   # no key looked up yet in this task


def _micros(arr: pa.Array) -> np.ndarray:
    return pc.fill_null(arr.view(pa.int64()), 0).to_numpy(zero_copy_only=False)


class SessionWindow(FamilyBase):
    name = "sessionWindow"
    layout = LAYOUT

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

    # -- the index of each key's sessions ---------------------------------------------------
    def rebuild_index(self, state: VersionedState) -> None:
        if _scanned(state):
            if self.indexed:
                for keys, rows in state.rows.items(1 << 20):
                    times, valid = keycodec.event_time_micros(
                        rows.column(self.key_count + self.event_time_index))
                    state.index.add_many(times, keys, valid)
            return
        rows = state.rows
        stored = rows.take(rows.live_ids())
        by_key = self._by_key(stored.columns[self.key_count:], list(rows.data))
        state.objects = {"sessions": by_key}
        if self.indexed:
            self._add_times(state, [(g, s, t) for g, d in by_key.items()
                                    for s, (_, t) in d.items()])

    def _sessions(self, state: VersionedState) -> dict:
        if "sessions" not in (state.objects or {}):
            self.rebuild_index(state)
        return state.objects["sessions"]

    def _by_key(self, values: list[pa.Array], state_keys: list,
                groups: list | None = None) -> dict[Hashable, dict]:
        """Rows (their value columns) by key: key -> session start -> (state key, event time
        in append mode, else None)."""
        n = len(state_keys)
        if groups is None:
            groups = keycodec.rows([values[i] for i in self.key_indexes], n)
        starts = _micros(values[self.session_index].flatten()[0]).tolist()
        if self.indexed:
            times, valid = keycodec.event_time_micros(values[self.event_time_index])
            times_list = [t if ok else None for t, ok in zip(times.tolist(), valid.tolist())]
        else:
            times_list = [None] * n
        by_key: dict[Hashable, dict] = {}
        for g, s, k, t in zip(groups, starts, state_keys, times_list):
            d = by_key.get(g)
            if d is None:
                d = by_key[g] = {}
            d[s] = (k, t)
        return by_key

    def _add_times(self, state: VersionedState, entries: list) -> None:
        entries = [(g, s, t) for g, s, t in entries if t is not None]
        if entries:
            state.index.add_many(np.fromiter((t for _, _, t in entries), np.int64, len(entries)),
                                 [(g, s) for g, s, _ in entries])

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
            owner, ids = state.rows.scan_prefixes(np.asarray(groups, state.prefix_dtype))
            rows = state.rows.take(ids)
            order = np.lexsort((_micros(rows.column(self.key_count - 1)), owner))
            return (pa.RecordBatch.from_arrays(rows.take(pa.array(order)).columns[
                self.key_count:], schema=self._value_schema()),
                np.bincount(owner, minlength=len(groups)))
        sessions = self._sessions(state)
        picked, counts = [], []
        for g in groups:
            d = sessions.get(g)
            if d:
                picked += [d[s][0] for s in sorted(d)]
            counts.append(len(d) if d else 0)
        rows = state.rows.take(state.rows.lookup(picked))
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
        order = np.lexsort((
            np.concatenate([np.arange(m), kept]),                          # then as they came
            np.concatenate([np.zeros(m, np.int8), np.ones(len(kept), np.int8)]),  # stored first
            np.concatenate([stored_starts, starts[kept]]),
            np.concatenate([stored_runs, run_of])))
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
        fresh = self._by_key(rows.columns, state_keys, groups)
        sessions = self._sessions(state)
        removed, times = [], []
        for g, d in fresh.items():
            old = sessions.get(g)
            if old:
                removed += [k for s, (k, _) in old.items() if s not in d]
                times += [(g, s, t) for s, (_, t) in d.items()
                          if s not in old or old[s][1] != t]
            else:
                times += [(g, s, t) for s, (_, t) in d.items()]
            sessions[g] = d
        if removed:
            self.metrics["numRemovedStateRows"] += state.pop_present(removed).num_rows
        state.put_rows(state_keys, pa.RecordBatch.from_arrays(
            key_columns + rows.columns, schema=state.schema))
        self.metrics["numUpdatedStateRows"] += n
        if self.indexed:
            self._add_times(state, times)

    def _replace_scanned(self, state: VersionedState, rows: pa.RecordBatch,
                         key_columns: list) -> None:
        """`_replace` on the tier: each key's stored sessions found by prefix scan."""
        n = rows.num_rows
        new_keys = state.keys(key_columns, n)
        _, ids = state.rows.scan_prefixes(np.unique(state.prefix_keys(key_columns[:-1], n)))
        old = state.rows.take(ids)
        old_keys = state.keys(old.columns[: self.key_count], old.num_rows)
        gone = ~np.isin(old_keys, new_keys)
        if gone.any():
            self.metrics["numRemovedStateRows"] += state.pop_present(old_keys[gone]).num_rows
        state.put_rows(new_keys, pa.RecordBatch.from_arrays(key_columns + rows.columns,
                                                            schema=state.schema))
        self.metrics["numUpdatedStateRows"] += n
        if self.indexed:   # a session new or whose event time moved gets an index entry
            times, valid = keycodec.event_time_micros(rows.column(self.event_time_index))
            old_times, old_valid = keycodec.event_time_micros(
                old.column(self.key_count + self.event_time_index))
            order = np.argsort(old_keys)
            at = np.minimum(np.searchsorted(old_keys[order], new_keys), len(order) - 1)
            match = order[at] if len(order) else np.zeros(n, np.int64)
            same = (np.zeros(n, bool) if not len(order) else
                    (old_keys[match] == new_keys) & old_valid[match]
                    & (old_times[match] == times))
            state.index.add_many(times, new_keys, valid & ~same)

    # -- after the input --------------------------------------------------------------------
    def finish(self, state: VersionedState) -> Iterator[pa.RecordBatch]:
        with self.updating():
            self._apply_pending(state)
        if self.output_mode == "complete":
            self.close_timings()
            for rows in state.rows.all_rows(self.batch_size):
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
        if _scanned(state):   # the stored session's own event time decides
            keys = np.unique(np.asarray(entries, state.key_dtype))
            ids = state.rows.lookup(keys)
            keys = keys[ids >= 0]
            times, valid = keycodec.event_time_micros(state.rows.take(ids[ids >= 0]).column(
                self.key_count + self.event_time_index))
            gone = keys[valid & (times <= threshold)]
        else:
            gone = self._evicted_sessions(state, entries, threshold)
        evicted = state.pop_present(gone)
        self.metrics["numRemovedStateRows"] += evicted.num_rows
        return pa.RecordBatch.from_arrays(evicted.columns[self.key_count:],
                                          schema=self._value_schema())

    def _evicted_sessions(self, state: VersionedState, entries: list, threshold: int) -> list:
        """The state keys of indexed sessions the threshold closes, dropped from the index
        of each key's sessions."""
        sessions = self._sessions(state)
        gone = []
        for g, s in entries:
            d = sessions.get(g)
            held = d.get(s) if d else None
            if held is None or held[1] is None or held[1] > threshold:
                continue   # merged away, evicted already, or extended since
            del d[s]
            if not d:
                del sessions[g]
            gone.append(held[0])
        return gone


def _runs(group_of, kept: np.ndarray) -> tuple[list, np.ndarray]:
    """The keys of the kept rows (sorted by key), once each in order, and each kept row's
    index among them."""
    if isinstance(group_of, np.ndarray):   # prefix bytes: compared in numpy
        kept_groups = group_of[kept]
        first = np.ones(len(kept), bool)
        first[1:] = kept_groups[1:] != kept_groups[:-1]
        return list(kept_groups[first]), np.cumsum(first) - 1
    runs: list[Hashable] = []
    run_of = np.empty(len(kept), np.int64)
    previous: Any = _NONE
    for j, i in enumerate(kept.tolist()):
        key = group_of[i]
        if previous is _NONE or key != previous:
            runs.append(key)
            previous = key
        run_of[j] = len(runs) - 1
    return runs, run_of


def _scanned(state: VersionedState) -> bool:
    """Whether the state is on the tier, its sessions found by prefix scan."""
    return state.prefix_dtype is not None
