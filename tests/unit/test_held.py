"""The states a worker holds between tasks (store.held.states): reuse, the cap, and the store's
upkeep after a commit, without Spark."""
import pyarrow as pa
import pytest

from arrowstate.errors import ArrowStateError
from arrowstate.store.formats import encoding
from arrowstate.store.held import states as held
from arrowstate.store.rows.hashed import HashedRows, available as hash_table_available
from arrowstate.store.rows.keyed import KeyedRows
from arrowstate.store.versions.versioned import VersionedState
import prerequisites


def _header(key="/ck/state/0/1", max_state_bytes=0):
    return {"stateKey": key, "queryRunId": "run", "operatorId": 0, "partitionId": 1,
            "conf": {"maxStateBytes": max_state_bytes}}


def _committed(n, version=1, **kw):
    """A state of n int keys, committed at `version`, by the query run "run"."""
    state = VersionedState([pa.field("k", pa.int64())], [pa.field("n", pa.int64())], **kw)
    keys = pa.array(range(n), pa.int64())
    state.put_rows(state.keys([keys], n), pa.RecordBatch.from_arrays([keys, keys],
                                                                     schema=state.schema))
    state.commit_files(version, 100)
    state.mark_committed(version, 1000)
    state.run_id = "run"
    return state


class _NoFiles:
    """A checkpoint this worker's states committed (version 0 needs no read)."""

    def tail(self, name, size):
        raise AssertionError("no file is read for version 0")


def test_a_kept_state_moves_to_the_hash_table_once_large_and_the_family_reindexes(
        monkeypatch):
    if not hash_table_available():
        prerequisites.missing("pandas' Int64HashTable with the methods arrowstate uses "
                              "(pandas._libs.hashtable; a pandas without them keeps keys in "
                              "a dict)")
    monkeypatch.setattr(held, "HASH_TABLE_MIN_KEYS", 10)
    states, rebuilt = held.HeldStates(), []
    small, large = _committed(9, hashed=True), _committed(10, hashed=True)
    states.keep(small, _header("small"), rebuilt.append)
    assert type(small.rows) is KeyedRows and rebuilt == []
    states.keep(large, _header("large"), rebuilt.append)
    assert type(large.rows) is HashedRows and rebuilt == [large]
    assert states.states == {"small": small, "large": large}


def test_a_held_state_is_taken_again_only_at_its_version_and_run():
    states = held.HeldStates()
    state = _committed(3)
    state.version, state.last_uid = 0, None   # version 0: what every checkpoint starts with
    states.keep(state, _header(), lambda s: None)
    assert states.reusable("/ck/state/0/1", 0, "run", _NoFiles(), False) is state
    assert states.states == {}   # taken out while the task runs
    states.keep(state, _header(), lambda s: None)
    assert states.reusable("/ck/state/0/1", 0, "another run", _NoFiles(), False) is None
    assert states.states == {}   # let go
    states.keep(_committed(3, version=0), _header(), lambda s: None)
    assert states.reusable("/ck/state/0/1", 1, "run", _NoFiles(), False) is None
    assert states.reusable("/ck/state/0/2", 0, "run", _NoFiles(), False) is None


def test_a_held_state_is_checked_against_its_delta_only_when_asked():
    """With speculative tasks another attempt may commit the same version after this one:
    then (verify) the delta's trailer must still carry the held state's unique id."""
    class Rewritten:   # the checkpoint's delta of version 3 is another attempt's
        def tail(self, name, size):
            data, _ = encoding.encode(pa.schema([("k", pa.int64())]), "delta", 3, [])
            return data[-size:]
    states = held.HeldStates()
    state = _committed(3)
    state.last_uid = b"u" * 16
    states.keep(state, _header(), lambda s: None)
    assert states.reusable("/ck/state/0/1", state.version, "run", Rewritten(), True) is None
    state = _committed(3)
    state.last_uid = b"u" * 16
    states.keep(state, _header(), lambda s: None)
    assert states.reusable("/ck/state/0/1", state.version, "run", Rewritten(), False) is state


def test_a_task_fails_before_its_commit_when_the_workers_state_would_pass_the_cap():
    states = held.HeldStates()
    states.keep(_committed(100), _header("other"), lambda s: None)
    state = _committed(100)
    total = state.memory_bytes() + states.states["other"].memory_bytes()
    states.check_cap(state, _header(max_state_bytes=0))       # no cap
    states.check_cap(state, _header(max_state_bytes=total))   # at the cap
    with pytest.raises(ArrowStateError) as e:
        states.check_cap(state, _header(max_state_bytes=total - 1))
    assert e.value.condition == "ARROWSTATE_STATE_CAP_EXCEEDED"
    assert e.value.parameters["bytes"] == str(total)   # parameters travel as text
