"""The worker's memory budget for state (store.held.budget): what it refuses, what it spills, and
where the tier's files go, without Spark."""
import os

import numpy as np
import pyarrow as pa
import pytest

from arrowstate.errors import ArrowStateError
from arrowstate.store.versions.versioned import VersionedState
from arrowstate.store.held import budget
from arrowstate.store.held.budget import MemoryBudget
from arrowstate.store.tier.tiered import TierPlace
from arrowstate.store.tier.tiered import TieredRows
import prerequisites


def _header(memory, percent=50, local_dir="/tmp"):
    return {"conf": {"memoryBytes": memory, "stateMemoryPercent": percent},
            "localDir": local_dir, "queryRunId": "r", "operatorId": 0, "partitionId": 3}


def test_budget_below_the_base_size_names_the_figure_needed():
    with pytest.raises(ArrowStateError) as failure:
        MemoryBudget().configure(_header(1 << 20))
    e = failure.value
    assert e.condition == "ARROWSTATE_MEMORY_BUDGET_TOO_SMALL"
    assert int(e.parameters["needed"]) > budget.resident_bytes()
    assert e.parameters["setting"] == "spark.arrowstate.worker.memory"


def test_a_batch_whose_working_set_passes_the_budget_fails_naming_its_peak():
    b = MemoryBudget()
    b.configure(_header(budget.resident_bytes() + (100 << 20)))
    if not b._peak_tracked:
        prerequisites.missing("a kernel that resets a process's peak resident size "
                              "(writing 5 to /proc/self/clear_refs)")
    b.check_peak(_header(0))            # nothing big yet
    big = np.ones(200 << 20, dtype=np.uint8)   # 200 MiB touched
    with pytest.raises(ArrowStateError) as failure:
        b.check_peak(_header(0))
    del big
    assert int(failure.value.parameters["needed"]) > int(failure.value.parameters["budget"])


def test_balance_spills_the_largest_state_until_the_rest_fits(tmp_path):
    b = MemoryBudget()
    b.configure(_header(budget.resident_bytes() + (66 << 20), percent=1,   # about 690 KB
                        local_dir=str(tmp_path)))
    states = []
    for n in (3_000, 30_000):   # 24 bytes a row
        state = VersionedState([pa.field("k", pa.int64(), nullable=False)],
                               [pa.field("v", pa.int64())], tier=b.place(f"/ck/state/0/{n}"))
        k = np.arange(n)
        state.put_rows(k, pa.RecordBatch.from_arrays([pa.array(k), pa.array(k)],
                                                     names=["k", "v"]))
        states.append(state)
    assert sum(s.memory_bytes() for s in states) > b.state_share
    b.balance(states)
    small, large = states
    assert large.disk_bytes() > 0 and small.disk_bytes() == 0
    assert sum(s.memory_bytes() for s in states) <= b.state_share


def test_state_memory_counts_a_familys_own_objects_and_the_tiers_filters(tmp_path):
    state = VersionedState([pa.field("k", pa.int64(), nullable=False)],
                           [pa.field("v", pa.int64())],
                           tier=TierPlace(str(tmp_path / "t"), memory_cap=1))
    k = np.arange(100_000)
    state.put_rows(k, pa.RecordBatch.from_arrays([pa.array(k), pa.array(k)], names=["k", "v"]))
    # on disk: what stays in memory is the Bloom filter and the block index
    assert state.disk_bytes() > 100_000 * 16
    assert 100_000 <= state.memory_bytes() <= 100_000 * 3
    before = state.memory_bytes()
    state.objects = {"variables": {"count": {(i,): ((i,), 5) for i in range(10_000)}},
                     "timerHeap": [(i, i, (i,)) for i in range(10_000)], "total": 10_000}
    assert state.memory_bytes() - before > 10_000 * 200


def test_without_a_budget_a_family_that_asks_gets_runs_that_stay_in_memory(tmp_path):
    """No budget: the tier only for a family that asks (session windows), its runs all in
    memory however large; no file is written, and balancing spills nothing."""
    b = MemoryBudget()
    b.configure(_header(0, local_dir=str(tmp_path)))
    assert b.place("/ck/state/0/0") is None
    place = b.place("/ck/state/0/1", without_budget=True)
    state = VersionedState([pa.field("k", pa.int64(), nullable=False)],
                           [pa.field("v", pa.int64())], tier=place)
    assert isinstance(state.rows, TieredRows)
    for lo in range(0, 400_000, 100_000):   # merged runs of 400K rows, 6.4 MB
        k = np.arange(lo, lo + 100_000)
        state.put_rows(k, pa.RecordBatch.from_arrays([pa.array(k), pa.array(k)],
                                                     names=["k", "v"]))
    b.balance([state])
    assert state.disk_bytes() == 0 and state.memory_bytes() > 400_000 * 16
    assert not os.path.exists(place.directory)
    assert state.rows.lookup(np.array([0, 399_999, 400_000])).tolist()[2] == -1


def test_each_local_directory_setting_gets_the_tiers_made_after_it(tmp_path):
    b = MemoryBudget()
    b.configure(_header(budget.resident_bytes() + (100 << 20), local_dir=str(tmp_path / "a")))
    first = b.place("/ck/state/0/0")
    b.configure(_header(budget.resident_bytes() + (100 << 20), local_dir=str(tmp_path / "b")))
    second = b.place("/ck/state/0/0")
    assert first.directory.startswith(str(tmp_path / "a"))
    assert second.directory.startswith(str(tmp_path / "b"))
    assert first.directory != second.directory.replace("/b/", "/a/")
