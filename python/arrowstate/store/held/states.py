"""The partition states one worker holds between tasks, under its memory budget: which held
state a task may take again, the store a new one lives in, the cap on what the worker
holds, and the store's upkeep after each commit (a large state's keys to the hash table,
the largest parts over the budget to disk, the check of the worker's peak memory). The
worker's task loop asks; the decisions are made here.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from ...errors import ArrowStateError
from ..lifecycle.sources import FileSource
from ..lineage import committed_base, committed_here
from ..versions.versioned import VersionedState
from .budget import MemoryBudget

# Keys a state of aggregation or deduplication holds before they move from a dict to a hash
# table in compiled code (rows.hashed): the table saves about 60 bytes a key but loads
# pandas, about 36 MB and 0.35 s in a worker that runs no pandas function.
HASH_TABLE_MIN_KEYS = 500_000


def new_state(family: Any, state_key: str, budget: MemoryBudget) -> VersionedState:
    """An empty partition state with the family's key and value fields
    (families.base.StateFamily), in the store the budget places it in
    (scripts/replay_tasks.py makes its states here too)."""
    return VersionedState(family.key_fields, family.value_fields,
                          named_columns=family.named_columns,
                          dropped_columns=family.dropped_columns,
                          evolve=family.evolve_column,
                          tier=(budget.place(state_key, family.runs_without_budget)
                                if family.tiered else None),
                          prefix_count=family.prefix_count, hashed=family.hashed_keys)


class HeldStates:
    """The worker's partition states, by state key (the partition's checkpoint directory),
    and its memory budget."""

    def __init__(self) -> None:
        self.states: dict[str, VersionedState] = {}
        self.budget = MemoryBudget()

    def forget(self, state_keys: Iterable[str]) -> None:
        """Lets go of partitions' states (stopped queries, partitions held elsewhere)."""
        for key in state_keys:
            state = self.states.pop(key, None)
            if state is not None:
                state.close()

    def configure(self, header: dict[str, Any]) -> None:
        """Takes a task's budget (see MemoryBudget.configure)."""
        self.budget.configure(header)

    def reusable(self, state_key: str, version: int, run_id: str,
                 files: FileSource, verify: bool,
                 base_id: str | None = None) -> VersionedState | None:
        """The partition's held state, taken out, when it is what the checkpoint holds at
        `version`: this query run committed it here (a task that failed after its commit
        has the JVM drop the state first), and, with `verify` (speculative tasks: another
        attempt of the same task may have committed after this one), its delta is still the
        one there, one ranged read of its trailer; with `base_id` (checkpoint format v2), it
        committed the delta the commit log names. Else None, and the held state, if any,
        is let go."""
        state = self.states.pop(state_key, None)
        if (state is not None and state.version == version and state.run_id == run_id
                and committed_base(state, base_id)
                and (not verify or committed_here(state, files))):
            return state
        if state is not None:
            state.close()
        return None

    def new_state(self, family: Any, state_key: str) -> VersionedState:
        """An empty state for the partition, in the store the budget places it in."""
        return new_state(family, state_key, self.budget)

    def check_cap(self, state: VersionedState, header: dict[str, Any]) -> None:
        """Fails the task (before it commits) when this worker's state would pass the cap
        (`maxStateBytes`; none when 0)."""
        cap = int(header["conf"].get("maxStateBytes", 0))
        if cap <= 0:
            return
        total = state.memory_bytes() + sum(s.memory_bytes() for s in self.states.values())
        if total > cap:
            raise ArrowStateError(
                "ARROWSTATE_STATE_CAP_EXCEEDED",
                f"this Python state worker would hold {total} bytes of state, over "
                f"spark.arrowstate.worker.maxStateBytes={cap} (query run "
                f"{header['queryRunId']}, operator {header['operatorId']}, partition "
                f"{header['partitionId']}, state {header['stateKey']}). Raise the setting, "
                "give executors more memory or cores, or use more shuffle partitions.",
                bytes=total, cap=cap, queryRunId=header["queryRunId"],
                operatorId=header["operatorId"], partitionId=header["partitionId"])

    def keep(self, state: VersionedState, header: dict[str, Any],
             rebuild_index: Callable[[VersionedState], None]) -> None:
        """After a task's commit: holds its state for the next task, its keys moved to the
        hash table once it is large (then `rebuild_index`, the family's, indexes the keys
        in their new form); spills the largest states while those in memory pass the
        budget's share; fails the task when the worker's peak memory passed the budget."""
        if state.move_to_hash_table(HASH_TABLE_MIN_KEYS):
            rebuild_index(state)
        self.states[header["stateKey"]] = state
        self.budget.balance(self.states.values())
        self.budget.check_peak(header)
