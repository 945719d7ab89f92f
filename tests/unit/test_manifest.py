"""Snapshots of tiered state as manifests naming run files (store.formats.manifest), without Spark:
what they write, what loads from them, what retention deletes, and damage."""
import gc
import os
import weakref

import numpy as np
import pyarrow as pa
import pytest

from arrowstate.store.formats import decoding, manifest, names as file_names
from arrowstate.store.formats.container import CorruptStateFile
from arrowstate.store.lifecycle import maintenance as lifecycle
from arrowstate.store.tier import runs, schedule
from arrowstate.store.tier.tiered import TierPlace
from arrowstate.store.versions.versioned import VersionedState
from dict_files import DictFiles


@pytest.fixture(autouse=True)
def small_runs(monkeypatch):
    """Small blocks, merges and run files, so a few thousand keys make many of each."""
    monkeypatch.setattr(runs, "BLOCK", 64)
    monkeypatch.setattr(schedule, "PACED_ROWS", 1500)
    monkeypatch.setattr(manifest, "PIECE_ROWS", 700)


class Checkpoint(DictFiles):
    """A partition directory in a dict, written as the JVM writes a commit's files."""

    def __init__(self):
        super().__init__()
        self.log = []   # per commit: its delta's size and the snapshot files it wrote

    def commit(self, done):
        """What the JVM does with a commit: the columns file and delta, then (maintenance)
        the snapshots' files in order, pruning, and the run files to delete."""
        self.files.update(done.written())
        for name, content in done.snapshots:
            if isinstance(content, str):   # a local file: copied, then deleted
                with open(content, "rb") as f:
                    self.files[name] = f.read()
                os.remove(content)
            else:
                self.files[name] = content
        self.log.append((len(done.delta),
                         [(n, len(self.files[n])) for n, _ in done.snapshots]))
        base = file_names.file_name(file_names.SNAPSHOT, done.prune_below)
        if done.prune_below > 0 and base in self.files:
            for name in list(self.files):
                parsed = file_names.parse_name(name)
                if parsed is not None and parsed[0] < done.prune_below:
                    del self.files[name]
            for name in done.delete:
                self.files.pop(name, None)


def _state(tmp_path, name="t", string_keys=False):
    key = pa.field("k", pa.string() if string_keys else pa.int64())
    return VersionedState([key], [pa.field("v", pa.int64())],
                          tier=TierPlace(str(tmp_path / name), memory_cap=2048))


def _key_column(raw, string_keys):
    return pa.array([f"key-{k}" for k in raw]) if string_keys else pa.array(raw)


def _run_versions(tmp_path, versions, string_keys=False, min_deltas=3, retain=4,
                  checkpoint=None, local_files=False):
    """Versions of random puts and removals on a tiered state, committed into `checkpoint`
    (snapshots made as local files with `local_files`, as a worker makes them); the live
    rows after each version."""
    state = _state(tmp_path, string_keys=string_keys)
    checkpoint = checkpoint if checkpoint is not None else Checkpoint()
    rng = np.random.default_rng(11)
    live, expected = {}, {}
    for version in range(1, versions + 1):
        raw = np.unique(rng.integers(0, 5000, 400))
        values = rng.integers(0, 1000, len(raw))
        cols = [_key_column(raw, string_keys)]
        state.put_rows(state.keys(cols, len(raw)),
                       pa.RecordBatch.from_arrays(cols + [pa.array(values)], ["k", "v"]))
        live.update(zip(cols[0].to_pylist(), values.tolist()))
        gone = np.unique(rng.integers(0, 5000, 150))
        gone_cols = [_key_column(gone, string_keys)]
        state.pop_present(state.keys(gone_cols, len(gone)))
        for k in gone_cols[0].to_pylist():
            live.pop(k, None)
        state.lifecycle.wait_for_snapshot()
        done = state.commit_files(version, retain, list_names=checkpoint.names)
        checkpoint.commit(done)
        state.mark_committed(version, min_deltas,
                             str(tmp_path / "snapshots") if local_files else None)
        expected[version] = dict(live)
    return state, checkpoint, expected


def _contents(state):
    rows = pa.Table.from_batches(list(state.all_rows(1000)), state.schema)
    return dict(zip(rows.column(0).to_pylist(), rows.column(1).to_pylist()))


def _loaded(tmp_path, checkpoint, version, tiered=True, string_keys=False, name="loaded"):
    if tiered:
        state = _state(tmp_path, name, string_keys)
    else:
        key = pa.field("k", pa.string() if string_keys else pa.int64())
        state = VersionedState([key], [pa.field("v", pa.int64())])
    state.load(checkpoint, version)
    return state


@pytest.mark.parametrize("string_keys", [False, True])
def test_snapshots_name_runs_and_write_only_the_new_ones(tmp_path, string_keys):
    """A tiered state's snapshots are manifests; a later one names run files an earlier one
    wrote instead of writing them again; every version retention keeps loads, on the tier
    (runs taken in as they are) and in memory (offline tools), equal to the rows it had."""
    state, checkpoint, expected = _run_versions(tmp_path, 14, string_keys)
    snapshots = sorted(file_names.parse_name(n)[0] for n in checkpoint.files
                       if n.endswith(file_names.SUFFIX[file_names.SNAPSHOT]))
    assert snapshots, "retention keeps a snapshot"
    made = {v: manifest.read(f"x/{file_names.file_name(file_names.SNAPSHOT, v)}", "",
                             checkpoint.files[file_names.file_name(file_names.SNAPSHOT, v)])
            for v in snapshots}
    assert all(m is not None for m in made.values())
    shared = set.intersection(*(m.names() for m in made.values()))
    assert len(made) < 2 or shared, "later snapshots name an earlier one's run files"
    run_files = {n for n in checkpoint.files if file_names.is_run_file(n)}
    assert run_files == set().union(*(m.names() for m in made.values())), \
        "retention left no run file that no snapshot names"
    loadable = [v for v in expected if v >= min(snapshots)]
    for version in loadable:
        for tiered in (True, False):
            loaded = _loaded(tmp_path, checkpoint, version, tiered, string_keys,
                             f"l{version}{tiered}")
            assert _contents(loaded) == expected[version], (version, tiered)
            assert len(loaded) == len(expected[version])
            loaded.close()
    # a state loaded from a manifest names its runs again: its next snapshot writes only
    # what changed since
    again = _loaded(tmp_path, checkpoint, 14, True, string_keys, "again")
    held = again._held_run_files()
    assert held and held <= made[max(snapshots)].names()
    again.close()
    state.close()


def test_a_snapshot_writes_about_what_changed_since_the_last(tmp_path):
    """Over many versions the bytes of run files a snapshot writes stay far below the
    state's whole size once it has grown (they follow what changed)."""
    state, checkpoint, _ = _run_versions(tmp_path, 3)
    sizes = []
    rng = np.random.default_rng(3)
    for version in range(4, 30):
        raw = rng.integers(0, 1 << 40, 300)
        cols = [pa.array(raw)]
        state.put_rows(state.keys(cols, len(raw)),
                       pa.RecordBatch.from_arrays(cols + [pa.array(raw)], ["k", "v"]))
        state.lifecycle.wait_for_snapshot()
        done = state.commit_files(version, 100, list_names=checkpoint.names)
        new_runs = [checkpoint_bytes for name, checkpoint_bytes in done.snapshots
                    if file_names.is_run_file(name)]
        if done.snapshots:
            sizes.append(sum(len(b) for b in new_runs))
        checkpoint.commit(done)
        state.mark_committed(version, 3)
    whole = sum(len(b) for n, b in checkpoint.files.items() if file_names.is_run_file(n))
    assert len(sizes) >= 6
    assert max(sizes[3:]) < whole / 2
    state.close()


def test_retention_keeps_every_run_file_a_kept_snapshot_names(tmp_path):
    state, checkpoint, expected = _run_versions(tmp_path, 25, retain=3)
    snapshots = [file_names.parse_name(n)[0] for n in checkpoint.files
                 if n.endswith(file_names.SUFFIX[file_names.SNAPSHOT])]
    oldest = min(snapshots)
    for version in range(oldest, 26):
        loaded = _loaded(tmp_path, checkpoint, version, name=f"r{version}")
        assert _contents(loaded) == expected[version]
        loaded.close()
    state.close()


def _damage(checkpoint, name, how):
    if how == "missing":
        del checkpoint.files[name]
    else:
        data = bytearray(checkpoint.files[name])
        data[len(data) // 2] ^= 0xFF
        checkpoint.files[name] = bytes(data)


@pytest.mark.parametrize("how", ["missing", "damaged"])
def test_a_run_file_missing_or_damaged_loads_an_older_snapshot_with_a_warning(
        tmp_path, capfd, how):
    state, checkpoint, expected = _run_versions(tmp_path, 12, retain=12)
    newest = max(file_names.parse_name(n)[0] for n in checkpoint.files
                 if n.endswith(file_names.SUFFIX[file_names.SNAPSHOT]))
    name = file_names.file_name(file_names.SNAPSHOT, newest)
    made = manifest.read(name, "", checkpoint.files[name])
    older = set().union(*(manifest.read(n, "", b).names() for n, b in checkpoint.files.items()
                          if n.endswith(file_names.SUFFIX[file_names.SNAPSHOT]) and n != name))
    victim = sorted(made.names() - older)[0]
    _damage(checkpoint, victim, how)
    loaded = _loaded(tmp_path, checkpoint, 12)
    assert _contents(loaded) == expected[12] and loaded.files_skipped == 1
    warning = capfd.readouterr().err
    assert victim in warning and "loading from an older snapshot" in warning
    loaded.close()
    # with no older snapshot nor deltas to rebuild it, the load fails naming the run file
    for n in list(checkpoint.files):
        parsed = file_names.parse_name(n)
        if parsed is not None and parsed[0] < newest:
            del checkpoint.files[n]
    with pytest.raises(CorruptStateFile) as failure:
        _loaded(tmp_path, checkpoint, newest, name="fails")
    assert victim in str(failure.value) and name in str(failure.value)
    state.close()


def test_a_snapshot_whose_earlier_run_files_are_gone_is_not_shipped(tmp_path, capfd):
    """A run file an earlier snapshot wrote, gone when a later one would name it again (its
    write failed): the later one is not shipped, and the one after writes the run again."""
    state, checkpoint, expected = _run_versions(tmp_path, 10, min_deltas=3, retain=50)
    held = sorted(state._held_run_files())   # the runs the snapshot of version 9 wrote
    assert held, "runs written at version 9 are still the tier's"
    for name in held:
        del checkpoint.files[name]
    rng = np.random.default_rng(5)
    shipped = []
    for version in range(11, 18):
        raw = rng.integers(10_000, 20_000, 50)
        cols = [pa.array(raw)]
        state.put_rows(state.keys(cols, len(raw)),
                       pa.RecordBatch.from_arrays(cols + [pa.array(raw)], ["k", "v"]))
        state.lifecycle.wait_for_snapshot()
        done = state.commit_files(version, 50, list_names=checkpoint.names)
        shipped += [n for n, _ in done.snapshots
                    if n.endswith(file_names.SUFFIX[file_names.SNAPSHOT])]
        checkpoint.commit(done)
        state.mark_committed(version, 3)
    assert "run files it names from earlier snapshots are missing" in capfd.readouterr().err
    assert shipped, "a later snapshot ships"
    newest = manifest.read(shipped[-1], "", checkpoint.files[shipped[-1]])
    assert newest.names() <= set(checkpoint.files)
    loaded = _loaded(tmp_path, checkpoint, 17)
    assert _contents(loaded) == _contents(state)
    loaded.close()
    state.close()


def test_a_manifest_is_self_verifying():
    made = manifest.Manifest([[manifest.Piece("0" * 32 + file_names.RUN_SUFFIX, 10, 2, "ab")]],
                             (1, 2), 2)
    data = manifest.encode(made, 7)
    assert manifest.read("d/7.arrowstate.snapshot", "", data) == made
    with pytest.raises(CorruptStateFile, match="checksum"):
        flipped = bytearray(data)
        flipped[3] ^= 1
        manifest.read("d/7.arrowstate.snapshot", "", bytes(flipped))
    with pytest.raises(CorruptStateFile, match="version 7"):
        manifest.read("d/8.arrowstate.snapshot", "", data)
    with pytest.raises(CorruptStateFile, match="read through"):
        decoding.decode("d/7.arrowstate.snapshot", "", data, pa.schema([("k0", pa.int64())]))


def test_a_snapshot_ships_over_commits_each_writing_about_its_delta(tmp_path, monkeypatch):
    """A manifest's run files ship a few per commit, a share of them over the commits until
    the next snapshot is due (or as much as the commit's delta), the manifest last;
    meanwhile no new snapshot starts, and every version loads (from the previous snapshot
    and the deltas, until the manifest is written)."""
    monkeypatch.setattr(lifecycle, "SHIP_MIN_BYTES", 1)
    monkeypatch.setattr(manifest, "PIECE_ROWS", 200)
    state, checkpoint, expected = _run_versions(tmp_path, 30, retain=40, local_files=True)
    spread = [(delta, shipped) for delta, shipped in checkpoint.log if shipped]
    assert len(spread) > 3, "snapshots took several commits"
    biggest = max(size for _, shipped in spread for _, size in shipped)
    totals, total = [], 0   # each snapshot's bytes, its manifest last
    for _, shipped in spread:
        for name, size in shipped:
            total += size
            if name.endswith(file_names.SUFFIX[file_names.SNAPSHOT]):
                totals.append(total)
                total = 0
    for delta, shipped in spread:   # a share: a snapshot's bytes over the 3 commits
        wrote = sum(size for _, size in shipped)
        assert wrote <= max(delta, max(totals) / 3) + biggest, shipped
    order = [n for _, shipped in checkpoint.log for n, _ in shipped]
    manifests = [i for i, n in enumerate(order)
                 if n.endswith(file_names.SUFFIX[file_names.SNAPSHOT])]
    assert len(manifests) >= 2
    assert all(file_names.is_run_file(n) for n in order[manifests[0] + 1:manifests[1]]), \
        "the next snapshot's run files come after the last manifest"
    for version in range(1, 31):
        loaded = _loaded(tmp_path, checkpoint, version, name=f"s{version}")
        assert _contents(loaded) == expected[version], version
        loaded.close()
    state.close()
    assert not os.listdir(tmp_path / "snapshots"), "no local file is left behind"


def test_a_snapshot_made_holds_no_run_of_the_tier(tmp_path):
    """A snapshot made, and shipping for several commits, holds the cells of its runs'
    files, not the runs: a run merged away meanwhile gives its memory back."""
    state, _, _ = _run_versions(tmp_path, 3)
    state.lifecycle.wait_for_snapshot()   # made at version 3, not shipped yet
    runs_then = [weakref.ref(r) for r in state.rows.runs]
    assert runs_then
    state.rows.clear()
    gc.collect()
    assert all(r() is None for r in runs_then)
    state.close()
