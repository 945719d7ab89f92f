"""Checkpoint format v2's lineage (store.lineage), without Spark: every file an attempt
writes carries its checkpoint id, a load follows the ids back from the one the commit log
names and reads no other attempt's file, and checkpoints of format v1's names (or of an
arrowstate before per-attempt names) continue under v2."""
import uuid

import pyarrow as pa
import pytest

from arrowstate.errors import ArrowStateError
from arrowstate.store.formats import container, names as file_names
from arrowstate.store.formats.container import CorruptStateFile
from arrowstate.store.lifecycle.chains import MissingStateFiles
from arrowstate.store.versions.versioned import VersionedState
import dict_files

FIELDS = [pa.field("k", pa.int64())], [pa.field("n", pa.int64())]


class Files(dict_files.DictFiles):
    """A partition directory that records which files were read (whole or their tail)."""

    def __init__(self, files):
        super().__init__(files)
        self.touched = set()

    def read(self, name):
        self.touched.add(name)
        return super().read(name)

    def tail(self, name, size):
        self.touched.add(name)
        return super().tail(name, size)


def _state():
    return VersionedState(*FIELDS)


def _commit(state, files, version, checkpoint_id, value, every=3, retain=100):
    """Puts key `version` (and key 0) = `value`, commits `version` as `checkpoint_id`'s
    attempt, and writes what the JVM would: the delta, then any snapshot made meanwhile."""
    keys = pa.array([0, version], pa.int64())
    values = pa.array([value, value], pa.int64())
    state.put_rows(state.keys([keys], 2), pa.RecordBatch.from_arrays(
        [keys, values], schema=state.schema))
    state.lifecycle.wait_for_snapshot()
    done = state.commit_files(version, retain, checkpoint_id=checkpoint_id)
    files.update(done.written())
    files.update(done.snapshots)
    state.mark_committed(version, every)
    return done


def _rows(state):
    return sorted(tuple(r.values()) for r in state.rows.take(state.rows.live_ids()).to_pylist())


def _history(files, versions, ids, value=lambda v: v, state=None, start=1, every=3):
    state = state or _state()
    for v in range(start, versions + 1):
        _commit(state, files, v, ids[v], value(v), every)
    return state


def _ids(n):
    return {v: str(uuid.uuid4()) for v in range(1, n + 1)}


def _load(files, version, checkpoint_id):
    state = _state()
    state.load(Files(files) if not isinstance(files, Files) else files, version,
               checkpoint_id=checkpoint_id)
    return state


def test_each_file_carries_its_attempts_id_and_a_load_follows_them_back():
    files, ids = {}, _ids(8)
    committed = _history(files, 8, ids)
    assert {f"{v}_{ids[v]}.arrowstate.delta" for v in range(1, 9)} <= set(files)
    assert f"3_{ids[3]}.arrowstate.snapshot" in files
    assert not any(file_names.checkpoint_id_of(n) is None and file_names.parse_name(n)
                   for n in files), "a file of format v1's name under v2"
    loaded = _load(files, 8, ids[8])
    assert _rows(loaded) == _rows(committed) and loaded.checkpoint_id == ids[8]
    # each delta records the id of the one before it, under its checksum
    for v in range(2, 9):
        data = files[f"{v}_{ids[v]}.arrowstate.delta"]
        assert container.base_id("d", "", data) == uuid.UUID(ids[v - 1]).bytes
    assert container.base_id("d", "", files[f"1_{ids[1]}.arrowstate.delta"]) is None


@pytest.mark.parametrize("late_version", [4, 6, 7])
def test_a_late_attempts_files_are_never_read(late_version):
    """Another attempt of a version (a zombie that read other input, a stage run again)
    committed it too, with a snapshot of its own, after the commit log named the first:
    the load of the lineage the log names reads none of its files, whatever the place in
    the snapshot cycle (a snapshot is made every 3 versions)."""
    files, ids = {}, _ids(9)
    committed = _history(files, 9, ids)
    zombie = _load(dict(files), late_version - 1, ids[late_version - 1])
    zombie_id = str(uuid.uuid4())
    before = set(files)
    _commit(zombie, files, late_version, zombie_id, -1, every=1)
    _commit(zombie, files, late_version + 1, str(uuid.uuid4()), -1, every=1)
    zombie.lifecycle.wait_for_snapshot()
    files.update(zombie.commit_files(late_version + 2, 100).snapshots)
    late = set(files) - before
    assert any(n.endswith(".snapshot") for n in late), late
    seen = Files(files)
    loaded = _load(seen, 9, ids[9])
    assert _rows(loaded) == _rows(committed)
    assert not (seen.touched & late), seen.touched & late
    # the zombie's version, when it is the one the log names, loads as it wrote it
    assert _rows(_load(files, late_version, zombie_id))[0][1] == -1


def test_the_committed_attempts_delta_missing_fails_naming_it():
    files, ids = {}, _ids(5)
    _history(files, 5, ids)
    del files[f"5_{ids[5]}.arrowstate.delta"]
    with pytest.raises(MissingStateFiles, match=f"5_{ids[5]}.arrowstate.delta"):
        _load(files, 5, ids[5])
    with pytest.raises(MissingStateFiles, match="checkpoint id"):
        _load(files, 5, str(uuid.uuid4()))   # an id no attempt wrote


def test_a_file_renamed_to_the_lineages_name_is_refused():
    """A file whose trailer's id is not its name's (another attempt's, renamed) is damage,
    never loaded as the committed one."""
    files, ids = {}, _ids(4)
    _history(files, 4, ids, every=100)
    other = {}
    _history(other, 4, ids, value=lambda v: -v, every=100)
    assert files[f"4_{ids[4]}.arrowstate.delta"] != other[f"4_{ids[4]}.arrowstate.delta"]
    forged = dict(files)
    forged[f"4_{ids[4]}.arrowstate.delta"] = _with_uid(
        other[f"4_{ids[4]}.arrowstate.delta"], uuid.uuid4().bytes)
    with pytest.raises(CorruptStateFile, match="not the .* its name says"):
        _load(forged, 4, ids[4])


def _with_uid(data, uid):
    """The file with another unique id in its trailer, its checksum made right again."""
    import struct
    import zlib
    t = container.TRAILER
    fields = list(t.unpack(data[-t.size:]))
    fields[8] = uid
    body = data[:-t.size]
    head = t.pack(*fields[:9], 0)[:-4]
    return body + head + struct.pack("<I", zlib.crc32(head, zlib.crc32(body)))


def test_a_checkpoint_of_format_v1_names_continues_under_v2_and_tells_v1_why_not_back():
    files, ids = {}, _ids(8)
    state = _history(files, 4, {v: None for v in range(1, 5)})   # format v1: no ids
    assert "4.arrowstate.delta" in files
    state = _history(files, 8, ids, state=state, start=5)
    assert container.base_id("d", "", files[f"5_{ids[5]}.arrowstate.delta"]) is None
    assert _rows(_load(files, 8, ids[8])) == _rows(state)
    # back under v1 (no ids): the versions written under v2 need them, and it says so
    with pytest.raises(MissingStateFiles, match="checkpointFormatVersion=2"):
        _load(files, 8, None)


def test_an_older_arrowstates_v2_checkpoint_loads_by_the_id_in_its_trailer():
    """Before per-attempt names, arrowstate wrote one name per version under v2, the id in
    the trailer only: the version the log names loads when its file carries that id, and
    fails on another attempt's."""
    files, ids = {}, _ids(3)
    state = _state()
    for v in range(1, 4):
        _commit(state, files, v, ids[v], v)
    older = {}
    for name, data in files.items():
        parsed = file_names.parse_name(name)
        older[file_names.file_name(parsed[1], parsed[0]) if parsed else name] = data
    assert _rows(_load(older, 3, ids[3])) == _rows(state)
    with pytest.raises(ArrowStateError) as e:
        _load(older, 3, str(uuid.uuid4()))
    assert e.value.condition == "CANNOT_LOAD_STATE_STORE.INVALID_CHECKPOINT_LINEAGE"
    # and goes on under per-attempt names
    more = dict(older)
    loaded = _load(older, 3, ids[3])
    _commit(loaded, more, 4, "00000000-0000-4000-8000-000000000004", 4)
    assert _rows(_load(more, 4, "00000000-0000-4000-8000-000000000004")) == _rows(loaded)


def test_retention_prunes_to_a_snapshot_of_the_lineage_and_names_it():
    files, ids = {}, _ids(12)
    state = _state()
    prunes = []
    for v in range(1, 13):
        done = _commit(state, files, v, ids[v], v, retain=4)
        if done.prune_below > 0:
            prunes.append((done.prune_below, done.prune_snapshot))
    assert prunes and all(name == f"{v}_{ids[v]}.arrowstate.snapshot" for v, name in prunes)
