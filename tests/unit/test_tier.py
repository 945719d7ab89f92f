"""The state tier (sorted runs, in memory or on local disk) against the in-memory store, and
the worker's memory budget, without Spark."""
import decimal
import os

import numpy as np
import pyarrow as pa
import pytest

from arrowstate import keys
from arrowstate.store.rows.keyed import KeyedRows
from arrowstate.store.tier import bloom, merging, runs, schedule
from arrowstate.store.tier.runs import LocalStateWriteFailed
from arrowstate.store.tier.tiered import TieredRows, TierPlace
from arrowstate.store.versions.versioned import VersionedState
from small_disk import small_disk


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Small blocks, reads and Bloom filter segments, so a few thousand keys make many of
    each."""
    monkeypatch.setattr(runs, "BLOCK", 64)
    monkeypatch.setattr(runs, "SPAN_BLOCKS", 4)
    monkeypatch.setattr(bloom, "SEGMENT_KEYS", 200)


def _columns(kind, raw):
    """Key columns of one kind from integers (-1: null where the kind allows it)."""
    nulls = raw < 0
    if kind == "long not null":
        return [pa.array(raw)]
    if kind == "long":
        return [pa.array(raw, mask=nulls)]
    if kind == "double":   # -0.0 is 0.0 and every NaN one NaN, as for Spark
        values = np.where(raw % 7 == 0, np.nan, (raw % 50) - 25.0)
        values = np.where(raw % 11 == 0, -0.0, values)
        return [pa.array(values, mask=nulls)]
    if kind == "string":   # empty, short, and longer than a word or two
        return [pa.array([("k" * int(r % 29) + str(r)) if r % 31 else "" for r in raw],
                         pa.string(), mask=nulls)]
    if kind == "binary, decimal":   # bytes that are not UTF-8
        return [pa.array([b"\xff" * int(r % 3) + str(r).encode() for r in raw], pa.binary(),
                         mask=nulls),
                pa.array([None if r % 17 == 0 else decimal.Decimal(int(r % 40)) / 4
                          for r in raw], pa.decimal128(10, 2))]
    if kind == "window and long":
        window = pa.StructArray.from_arrays(
            [pa.array(raw // 10 * 10, pa.timestamp("us")),
             pa.array(raw // 10 * 10 + 10, pa.timestamp("us"))], names=["start", "end"],
            mask=pa.array(raw % 13 == 0))
        return [window, pa.array(raw % 10, mask=nulls)]
    raise AssertionError(kind)


KINDS = ["long not null", "long", "double", "window and long", "string", "binary, decimal"]


def both_keys(kind, dtype, raw):
    """Keys of one kind from integers: as a store of key arrays takes them, as KeyedRows
    takes them, and their columns."""
    cols = _columns(kind, raw)
    return keys.key_array(cols, len(raw), dtype, (12345, 678)), keys.rows(cols, len(raw)), cols


def assert_answers_alike(ours, theirs, probes, step):
    """A store of key arrays answers as KeyedRows: the same count, the same keys found
    with the same rows, the same first absent keys. `probes`: `both_keys`' result."""
    probe_ours, probe_theirs, _ = probes
    assert len(ours) == len(theirs), step
    a, b = ours.lookup(probe_ours), theirs.lookup(probe_theirs)
    assert ((a >= 0) == (b >= 0)).all(), step
    assert (list(map(str, ours.take(a[a >= 0]).to_pylist()))   # as text: NaN is NaN
            == list(map(str, theirs.take(b[b >= 0]).to_pylist())))
    candidates = np.arange(0, len(a), 2)
    assert (ours.first_absent(probe_ours, candidates).tolist()
            == theirs.first_absent(probe_theirs, candidates).tolist()), step


def _schema(kind):
    fields = [pa.field(f"k{i}", c.type, nullable=kind != "long not null")
              for i, c in enumerate(_columns(kind, np.arange(2)))]
    return pa.schema(fields + [pa.field(f"v{len(fields)}", pa.int64())])


@pytest.mark.parametrize("kind, paced", [(k, False) for k in KINDS]
                         + [("long", True), ("string", True)])
def test_tier_answers_as_the_in_memory_store(tmp_path, monkeypatch, kind, paced):
    """Random puts and removals, with runs merged in memory and on disk (and, with
    `paced`, the larger merges a step at a time in a thread while the tier goes on):
    every lookup, row, removal and count as KeyedRows gives them."""
    monkeypatch.setattr(schedule, "PACED_ROWS", 600 if paced else 1 << 30)
    schema = _schema(kind)
    dtype = keys.key_dtype(list(schema)[:-1])
    assert dtype is not None and (dtype == np.int64) == (kind == "long not null")
    ours = TieredRows(schema, dtype, str(tmp_path / "tier"), memory_cap=4096)
    theirs = KeyedRows(schema)
    rng = np.random.default_rng(7)

    for step in range(120):
        raw = rng.integers(-1 if kind != "long not null" else 0, 3000,
                           int(rng.integers(1, 400)))
        ours_keys, their_keys, cols = both_keys(kind, dtype, raw)
        if rng.random() < 0.65:
            batch = pa.RecordBatch.from_arrays(cols + [pa.array(rng.integers(0, 99, len(raw)))],
                                               schema=schema)
            ours.insert(ours_keys, batch)
            theirs.insert(their_keys, batch)
        elif rng.random() < 0.5:
            got, want = ours.pop_present(ours_keys), theirs.pop_present(their_keys)
            assert sorted(map(str, got.to_pylist())) == sorted(map(str, want.to_pylist()))
        else:
            ours.discard(ours_keys, pa.RecordBatch.from_arrays(cols, names=schema.names[:-1]))
            theirs.discard(their_keys)
        if step % 30 == 29:
            ours.spill()
        if paced and step % 7 == 0:   # a commit: the next step of the paced merges
            ours.compact_if_sparse()
        probes = both_keys(kind, dtype, rng.integers(-1, 3000, 300))
        assert_answers_alike(ours, theirs, probes, step)
    assert any(run.on_disk for run in ours.runs)
    assert ours.disk_bytes() > 0
    assert (ours.merges.started > 0) == paced
    rows = sorted(map(str, pa.Table.from_batches(list(ours.all_rows(100)), schema).to_pylist()))
    assert rows == sorted(map(str, pa.Table.from_batches(list(theirs.all_rows(100)),
                                                         schema).to_pylist()))
    ours.close()
    assert not os.path.exists(tmp_path / "tier")


@pytest.mark.parametrize("group_type", [pa.int64(), pa.int32()])
def test_a_prefix_scan_finds_each_groups_live_rows(tmp_path, group_type):
    """Session windows' layout (grouping key, session start): random puts and removals of
    sessions, runs in memory and on disk (Bloom filters by prefix, ranges across blocks and
    segments); each scan gives exactly the live sessions of the groups asked for."""
    fields = [pa.field("g", group_type), pa.field("start", pa.timestamp("us"))]
    state = VersionedState(fields, [pa.field("v", pa.int64())],
                           tier=TierPlace(str(tmp_path / "t"), memory_cap=8192),
                           prefix_count=1)
    schema = state.schema
    rows = state.rows
    assert isinstance(rows, TieredRows) and rows.prefix_width == 1 + group_type.bit_width // 8
    live: dict = {}
    rng = np.random.default_rng(3)
    for step in range(150):
        g, start = random_sessions(rng)
        n = len(g)
        g_col = pa.array(g, group_type, mask=g == 0)   # the null group is a group too
        cols = [g_col, pa.array(start, pa.timestamp("us"))]
        batch_keys = state.keys(cols, n)
        names = [(-1 if gi == 0 else int(gi), int(s)) for gi, s in zip(g, start)]
        if rng.random() < 0.7:
            value = rng.integers(0, 1000, n)
            rows.insert(batch_keys, pa.RecordBatch.from_arrays(cols + [pa.array(value)],
                                                               schema=schema))
            live.update(zip(names, value.tolist()))
        else:
            rows.pop_present(batch_keys)
            for name in names:
                live.pop(name, None)
        if step % 40 == 39:
            rows.spill()
        assert_scan_finds_live_sessions(state, rng, group_type, live, step)
    assert any(run.on_disk for run in rows.runs)
    state.close()


def random_sessions(rng):
    """Groups and session starts (microseconds) of 1-300 sessions; a fifth of the time all
    of one group (ranges over blocks)."""
    n = int(rng.integers(1, 300))
    g = rng.integers(0, 400, n)
    start = rng.integers(0, 60, n) * 1000
    if rng.random() < 0.2:
        g[:] = int(rng.integers(0, 400))
        start = rng.integers(0, 5000, n) * 1000
    return g, start


def assert_scan_finds_live_sessions(state, rng, group_type, live, step):
    """A scan of random groups (the null group among them) finds exactly their live
    sessions: `live`, (group or -1, start) -> value."""
    asked = np.unique(rng.integers(0, 420, 60))
    asked_col = pa.array(asked, group_type, mask=asked == 0)
    owner, ids = state.rows.scan_prefixes(state.prefix_keys([asked_col], len(asked)))
    found = state.rows.take(ids)
    want_groups = {-1 if a == 0 else int(a): i for i, a in enumerate(asked)}
    # the session starts as microseconds, cast once for the whole answer
    got = sorted((-1 if k0 is None else k0, k1, v0, asked_index)
                 for k0, k1, v0, asked_index in zip(
                     found.column("k0").to_pylist(),
                     found.column("k1").cast(pa.int64()).to_pylist(),
                     found.column("v0").to_pylist(), owner.tolist()))
    want = sorted((gk, s, v, want_groups[gk]) for (gk, s), v in live.items()
                  if gk in want_groups)
    assert got == want, step


def test_a_frozen_view_reads_runs_that_merges_have_since_deleted(tmp_path):
    schema = _schema("long not null")
    rows = TieredRows(schema, np.dtype(np.int64), str(tmp_path / "t"), memory_cap=1)

    def put(lo, hi):
        k = np.arange(lo, hi)
        rows.insert(k, pa.RecordBatch.from_arrays([pa.array(k), pa.array(k * 2)],
                                                  schema=schema))

    put(0, 1000)
    put(1000, 1600)
    frozen = rows.frozen()
    before = {r.path for r in rows.runs}
    for lo in range(0, 4000, 200):   # merges take in every run: their files are deleted
        put(lo, lo + 200)
    assert before and not any(os.path.exists(p + ".keys") for p in before)
    got = pa.Table.from_batches(list(frozen.batches(300)), schema)
    assert got.column("k0").to_pylist() == list(range(1600))
    assert got.column("v1").to_pylist() == [2 * k for k in range(1600)]


def test_versioned_state_takes_the_tier_for_keys_it_can_encode(tmp_path):
    place = TierPlace(str(tmp_path / "t"), memory_cap=1 << 20)
    fixed = VersionedState([pa.field("k", pa.int64())], [pa.field("n", pa.int64())],
                           tier=place)
    strings = VersionedState([pa.field("k", pa.string())], [pa.field("n", pa.int64())],
                             tier=place)
    lists = VersionedState([pa.field("k", pa.list_(pa.int64()))], [pa.field("n", pa.int64())],
                           tier=place)
    assert isinstance(fixed.rows, TieredRows) and isinstance(strings.rows, TieredRows)
    assert isinstance(lists.rows, KeyedRows)
    assert isinstance(VersionedState([pa.field("k", pa.int64())], [], tier=None).rows,
                      KeyedRows)


def test_a_full_disk_names_the_directory_and_the_setting(tmp_path):
    with small_disk(tmp_path / "small", "64k") as mount:
        schema = _schema("long not null")
        rows = TieredRows(schema, np.dtype(np.int64), str(mount / "t"), memory_cap=1)
        k = np.arange(100_000)
        with pytest.raises(LocalStateWriteFailed) as failure:
            rows.insert(k, pa.RecordBatch.from_arrays([pa.array(k), pa.array(k)],
                                                      schema=schema))
        e = failure.value
        assert e.condition == "ARROWSTATE_LOCAL_STATE_WRITE_FAILED"
        assert e.parameters["path"].startswith(str(mount))
        assert e.parameters["setting"] == "spark.arrowstate.worker.localDir"
        assert "full" in e.parameters["reason"]
        assert os.listdir(mount / "t") == [], "a run that failed leaves no file behind"


def _long_rows(schema, k):
    return pa.RecordBatch.from_arrays([pa.array(k), pa.array(k * 2)], schema=schema)


def test_paced_merges_spread_their_writes_over_the_commits(tmp_path, monkeypatch):
    """The largest merges write their result a step per commit, each step about PACE
    times the rows added since the one before, so no commit writes a whole large merge;
    every merge still ends, the runs stay few, and the answers are a dict's."""
    monkeypatch.setattr(schedule, "PACED_ROWS", 2000)
    monkeypatch.setattr(merging, "MERGE_ROWS", 64)
    schema = _schema("long not null")
    rows = TieredRows(schema, np.dtype(np.int64), str(tmp_path / "t"), memory_cap=4096)
    rng = np.random.default_rng(5)
    live: dict = {}
    per_commit, largest, step_writes, most_runs = 500, 0, [], 0
    for commit in range(120):
        k = rng.integers(0, 1 << 40, per_commit)
        rows.insert(k, _long_rows(schema, k))
        live.update(zip(k.tolist(), (k * 2).tolist()))
        before = {id(m): m.written for m in rows.merges.paced}
        rows.compact_if_sparse()
        if rows.merges.stepper is not None:
            rows.merges.stepper.join()
        for merge in rows.merges.paced:
            wrote = merge.written - before.get(id(merge), 0)
            bound = max(schedule.PACE * per_commit, merge.total / schedule.PACE_STEPS)
            # a step ends at the first piece of the merge past its quota
            assert wrote <= bound + schedule.FANOUT * merging.MERGE_ROWS, (commit, merge.total)
            step_writes.append(wrote)
            largest = max(largest, merge.total)
        most_runs = max(most_runs, len(rows.runs))
    assert largest >= 16 * per_commit, "merges large enough to be spread"
    assert max(step_writes) < largest / 4
    assert most_runs <= 4 * schedule.FANOUT
    assert rows.merges.started > 0
    probes = np.array(list(live)[::7] + [-1, -2], dtype=np.int64)
    ids = rows.lookup(probes)
    assert (ids[:-2] >= 0).all() and (ids[-2:] < 0).all()
    assert rows.take(ids[:-2]).column("v1").to_pylist() == [live[p] for p in probes[:-2]]
    rows.merges.settle()
    assert not rows.merges.paced and len(rows) == len(live)
    rows.close()


def test_a_tier_loaded_whole_merges_unpaced(tmp_path, monkeypatch):
    """Rows added without commits between (a load) merge whole as they come, so a loaded
    tier holds few runs and is not left with a backlog of merges."""
    monkeypatch.setattr(schedule, "PACED_ROWS", 2000)
    schema = _schema("long not null")
    rows = TieredRows(schema, np.dtype(np.int64), str(tmp_path / "t"), memory_cap=4096)
    with rows.merges.unpaced():
        for lo in range(0, 60_000, 500):
            rows.insert(np.arange(lo, lo + 500), _long_rows(schema, np.arange(lo, lo + 500)))
        # the merges still running in the background (on a busy machine they lag the
        # inserts): each runs whole, so they end without further changes
        while rows.merges.stepper is not None:
            rows.merges.collect(wait=True)
    assert len(rows.runs) <= 3 * schedule.FANOUT and len(rows.merges.paced) <= 1
    assert len(rows) == 60_000
    assert rows.take(rows.lookup(np.array([0, 59_999]))).column("v1").to_pylist() == [
        0, 119_998]
    rows.close()


def test_a_paced_merge_on_a_full_disk_fails_at_the_next_change(tmp_path, monkeypatch):
    """A step that cannot write (a full local disk) fails the next change of the tier with
    the error naming the directory, and leaves no file of its own behind."""
    monkeypatch.setattr(schedule, "PACED_ROWS", 2000)
    with small_disk(tmp_path / "small", "256k") as mount:
        schema = _schema("long not null")
        rows = TieredRows(schema, np.dtype(np.int64), str(mount / "t"), memory_cap=1 << 20)
        with pytest.raises(LocalStateWriteFailed) as failure:
            for lo in range(0, 200_000, 1000):   # in memory until the merges write
                rows.insert(np.arange(lo, lo + 1000),
                            _long_rows(schema, np.arange(lo, lo + 1000)))
                rows.compact_if_sparse()
        assert failure.value.parameters["path"].startswith(str(mount))
        assert rows.merges.started > 0 and not rows.merges.paced
        rows.close()
        assert not os.path.exists(mount / "t")


def test_hashed_keys_are_equal_exactly_when_the_values_are():
    """Strings hashed for the tier: the same value gives the same key wherever it sits
    (sliced arrays, other neighbours, large_string), distinct values distinct keys (200K
    values of every length to 40 bytes, differing in one byte or only in length), and
    other seeds other keys."""
    rng = np.random.default_rng(5)
    values = list({bytes(rng.integers(0, 256, int(rng.integers(0, 41))).astype(np.uint8))
                   for _ in range(200_000)})
    values += [b"", b"\0", b"\0\0", b"a" * 16, b"a" * 17, b"a" * 15 + b"b"]
    values = list(dict.fromkeys(values))
    column = pa.array(values, pa.binary())
    dtype = keys.key_dtype([pa.field("k", pa.binary())])
    seeds = (3, 4)
    hashed = keys.key_array([column], len(values), dtype, seeds)
    assert len(np.unique(hashed)) == len(values)
    for lo, hi in ((1, 7), (1000, 1010), (len(values) - 5, len(values))):
        assert (keys.key_array([column.slice(lo, hi - lo)], hi - lo, dtype, seeds)
                == hashed[lo:hi]).all()
    shuffled = rng.permutation(len(values))[:1000]
    assert (keys.key_array([column.take(pa.array(shuffled))], 1000, dtype, seeds)
            == hashed[shuffled]).all()
    assert (keys.key_array([column.cast(pa.large_binary())], len(values), dtype, seeds)
            == hashed).all()
    assert not (keys.key_array([column], len(values), dtype, (5, 6)) == hashed).any()
    nulls = pa.array([None, b"", None], pa.binary())
    got = keys.key_array([nulls], 3, dtype, seeds)
    assert got[0] == got[2] != got[1]


@pytest.mark.parametrize("fields", [
    [pa.field("k", pa.int64(), nullable=False)],
    [pa.field("k", pa.int64()), pa.field("start", pa.timestamp("us"))],
    [pa.field("k", pa.float64()), pa.field("flag", pa.bool_())]])
def test_membership_and_unique_of_tier_keys_are_numpys(fields):
    """`keys.is_in`, `keys.index_in` and `keys.unique` (Arrow's hash table over the key
    bytes) answer as `np.isin`, a dict and `np.unique` (but in the order keys first come) for keys
    in each `key_dtype` form (int64, and bytes with validity and normalised bits): nulls
    against zeros, -0.0 and 0.0, NaN, repeats, and either side empty."""
    rng = np.random.default_rng(11)
    n = 3000

    def column(f, size):
        if pa.types.is_floating(f.type):
            values = rng.choice([0.0, -0.0, 1.5, float("nan"), 2.0 ** -1074], size)
        elif pa.types.is_boolean(f.type):
            values = rng.integers(0, 2, size).astype(bool)
        else:
            values = rng.choice([0, 1, 256, 1 << 40, -1], size)
        mask = None if not f.nullable else rng.random(size) < 0.1
        return pa.array(values, mask=mask).cast(f.type)

    dtype = keys.key_dtype(fields)
    both = keys.key_array([column(f, 2 * n) for f in fields], 2 * n, dtype)
    a, b = both[:n], both[n:][rng.random(n) < 0.5]
    assert keys.is_in(a, b).tolist() == np.isin(a, b).tolist()
    assert keys.is_in(b, a).tolist() == np.isin(b, a).tolist()
    assert keys.is_in(a, a[:0]).tolist() == [False] * n
    assert keys.is_in(a[:0], a).tolist() == []
    first_in_b = {}
    for i, k in enumerate(b.tolist()):
        first_in_b.setdefault(k, i)
    assert keys.index_in(a, b).tolist() == [first_in_b.get(k, -1) for k in a.tolist()]
    assert keys.index_in(a, a[:0]).tolist() == [-1] * n
    once = keys.unique(a)
    assert once.dtype == a.dtype and sorted(once.tolist()) == np.unique(a).tolist()
    first = {}
    for i, k in enumerate(a.tolist()):
        first.setdefault(k, i)
    assert once.tolist() == sorted(first, key=first.get)   # in the order they first come
    assert len(keys.unique(a[:0])) == 0


def test_membership_and_unique_of_eight_byte_keys_are_numpys():
    """Keys of eight bytes (a grouping prefix of one long key, say), which Arrow hashes as
    int64 words: as `np.isin` and `np.unique`, trailing zero bytes and repeats included."""
    rng = np.random.default_rng(12)
    raw = rng.choice([0, 1, 255], (4000, 8)).astype(np.uint8)
    raw[rng.random(4000) < 0.3, 4:] = 0   # keys alike but for their trailing zeros
    both = raw.view("S8").ravel()
    a, b = both[:2000], both[2000:][rng.random(2000) < 0.5]
    assert keys.is_in(a, b).tolist() == np.isin(a, b).tolist()
    assert keys.is_in(b, a[::3]).tolist() == np.isin(b, a[::3]).tolist()
    once = keys.unique(a)
    assert once.dtype == a.dtype and sorted(once.tolist()) == np.unique(a).tolist()
    assert len(once) == len({bytes(k) for k in raw[:2000]})


@pytest.mark.parametrize("dtype", ["S9", "int64"])
def test_searching_and_merging_sorted_keys_agree_with_a_dict(dtype):
    """A run's key search, by binary search (few probes) and by merging (many), and the
    merge of sorted pieces where the newest entry of a key wins: as a dict says, with
    repeated probes, probes past either end and keys alike but for trailing zero bytes."""
    rng = np.random.default_rng(5)

    def sorted_keys(n):
        if dtype == "int64":
            return np.unique(rng.integers(-500, 500, n))
        raw = rng.choice([0, 1, 7], (n, 9)).astype(np.uint8)
        raw[rng.random(n) < 0.3, 5:] = 0
        return np.unique(raw.view("S9").ravel())

    for n_keys, n_probes in [(600, 20), (600, 400), (50, 300), (0, 10), (40, 0)]:
        run_keys = sorted_keys(n_keys) if n_keys else sorted_keys(1)[:0]
        probes = np.sort(np.concatenate([sorted_keys(n_probes), run_keys[::4]]))
        where = {k: i for i, k in enumerate(run_keys.tolist())}
        found, pos = np.zeros(len(probes), bool), np.zeros(len(probes), np.int64)
        runs._search(run_keys, probes, found, pos)
        assert found.tolist() == [p in where for p in probes.tolist()]
        assert pos[found].tolist() == [where[p] for p in probes[found].tolist()]

    pieces, newest = [], {}
    for age in range(4):
        piece = sorted_keys(300)
        alive = rng.random(len(piece)) < 0.8
        pieces.append((piece, alive, pa.record_batch({"age": np.full(len(piece), age),
                                                      "i": np.arange(len(piece))})))
        newest.update({k: (a, age, i) for i, (k, a) in enumerate(zip(piece.tolist(),
                                                                      alive.tolist()))})
    merged_keys, alive, rows = merging.merge_sorted(pieces)
    assert merged_keys.tolist() == sorted(newest)
    assert list(zip(alive.tolist(), rows.column("age").to_pylist(),
                    rows.column("i").to_pylist())) == [newest[k] for k in sorted(newest)]
