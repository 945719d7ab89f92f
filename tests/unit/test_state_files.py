"""Self-verifying state files: every byte flip and truncation of a real delta and snapshot
is detected, crafted files are errors (never crashes or huge allocations), a damaged
snapshot is repaired around, and format 1 files still load."""
import datetime as dt
import decimal
import json
import struct
import subprocess
import sys
import textwrap
import zlib
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest

from arrowstate import keys as keycodec
from arrowstate.store.formats.container import CorruptStateFile
from arrowstate.store.lifecycle.chains import MissingStateFiles
from arrowstate.store.versions.versioned import VersionedState
from arrowstate.store.formats import compact, container, decoding, encoding, names as file_names
from arrowstate.store.formats import files
import dict_files

KEYS = [pa.field("user", pa.string()), pa.field("window", pa.struct(
    [("start", pa.timestamp("us", tz="UTC")), ("end", pa.timestamp("us", tz="UTC"))]))]
VALUES = [pa.field("count", pa.int64()), pa.field("total", pa.decimal128(20, 3)),
          pa.field("names", pa.list_(pa.string()))]
WHERE, CONTEXT = "ck/state/0/3", "operator 0, partition 3, version 7"


class DictFiles(dict_files.DictFiles):
    def __init__(self, contents, where=WHERE, context=CONTEXT):
        super().__init__(contents, where, context)


def _state():
    return VersionedState(KEYS, VALUES)


def _put(state, version, n=6):
    users = [f"user-{version}-{i}" if i % 3 else f"é{i}" for i in range(n)]
    start = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(minutes=version)
    window = pa.StructArray.from_arrays(
        [pa.array([start] * n, KEYS[1].type.field(0).type),
         pa.array([start + dt.timedelta(minutes=10)] * n, KEYS[1].type.field(1).type)],
        fields=list(KEYS[1].type))
    batch = pa.RecordBatch.from_arrays([
        pa.array(users), window, pa.array(np.arange(n) + version),
        pa.array([decimal.Decimal(f"{version}.{i:03d}") for i in range(n)], VALUES[1].type),
        pa.array([[u, None] for u in users], VALUES[2].type)], names=["a", "b", "c", "d", "e"])
    keys = keycodec.rows(batch.columns[:2], n)
    state.put_rows(keys, batch)
    return keys


def _history(versions=10, every=4, retain=100, compact=True):
    """Commits `versions` versions; returns the written files and each version's rows.
    Small deltas are compact (format 4) unless `compact` is False (formats 2 and 3)."""
    state, written, expected = _state(), {}, {}
    with mock.patch.object(files, "COMPACT_MAX_BYTES",
                           files.COMPACT_MAX_BYTES if compact else -1):
        for v in range(1, versions + 1):
            keys = _put(state, v)
            if v % 2 == 0:
                state.pop_present(keys[:2])
            state.lifecycle.wait_for_snapshot()
            done = state.commit_files(v, retain)
            written.update(done.written())
            written.update(done.snapshots)
            state.mark_committed(v, every)
            expected[v] = _rows(state)
    return written, expected


def _rows(state):
    return sorted(json.dumps(r, default=str)
                  for r in state.rows.take(state.rows.live_ids()).to_pylist())


def _load(contents, version):
    state = _state()
    state.load(DictFiles(contents), version)
    return state


def test_history_round_trips_through_its_files():
    written, expected = _history()
    for v in range(1, 11):
        assert _rows(_load(written, v)) == expected[v]


SWEEP = textwrap.dedent('''
    import json, sys
    sys.path[:0] = [sys.argv[1], sys.argv[1] + "/../helpers"]
    import pyarrow as pa
    from test_state_files import KEYS, VALUES, WHERE
    from arrowstate.store.formats import container, decoding, names as file_names
    schema = pa.schema([pa.field(f"k{i}", f.type) for i, f in enumerate(KEYS)]
                       + [pa.field(f"v{i}", f.type) for i, f in enumerate(VALUES)])
    result = {}
    sample = {n: bytes.fromhex(d) for n, d in json.load(sys.stdin).items()}
    schemas = {n: d for n, d in sample.items() if file_names.is_columns_file(n)}
    for name, data in sample.items():
        path = f"{WHERE}/{name}"
        # a damaged columns file is found by loading a compact delta that names it
        target = "6.arrowstate.delta" if name in schemas else name
        silent, unnamed, cases = 0, [], 0
        variants = [data[:cut] for cut in range(len(data))]
        for i in range(len(data)):
            for mask in (0x01, 0x80, 0xFF):
                damaged = bytearray(data)
                damaged[i] ^= mask
                variants.append(bytes(damaged))
        for damaged in variants:
            cases += 1
            found = dict(sample, **{name: damaged})
            try:
                decoding.decode(f"{WHERE}/{target}", "test", found[target], schema,
                             read_columns=found.get)
                silent += 1
            except container.CorruptStateFile as e:
                if path not in str(e):
                    unnamed.append(str(e))
        result[name] = {"cases": cases, "silent": silent, "unnamed": unnamed[:3]}
    print(json.dumps(result))
''')


def test_every_byte_flip_and_truncation_is_detected_without_a_crash(tmp_path):
    written, _ = _history()
    full, _ = _history(compact=False)
    (columns_file,) = [n for n in written if file_names.is_columns_file(n)]
    # a compact delta and the columns file it names, a format 2 delta, a snapshot
    files_swept = {n: written[n] for n in ("6.arrowstate.delta", "4.arrowstate.snapshot",
                                           columns_file)}
    files_swept["7.arrowstate.delta"] = full["7.arrowstate.delta"]
    sample = {n: data.hex() for n, data in files_swept.items()}
    (tmp_path / "sweep.py").write_text(SWEEP)
    # in its own process: a crash there is a failure here, not the end of the test run
    done = subprocess.run(
        [sys.executable, str(tmp_path / "sweep.py"),
         str(__import__("pathlib").Path(__file__).parent)],
        input=json.dumps(sample), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    for name, seen in result.items():
        assert seen["cases"] > 3 * len(files_swept[name])
        assert seen["silent"] == 0 and seen["unnamed"] == [], (name, seen)


def _schema():
    return _state().schema


def _reframe(payload, kind="delta", version=3, rows=None, fmt=container.FORMAT_VERSION):
    """A file around `payload` with a valid trailer and checksum (as a forger would)."""
    if rows is None:
        rows = sum(b.num_rows for b in pa.ipc.open_stream(payload))
    head = container.TRAILER.pack(container.MAGIC, fmt, files.KIND_CODE[kind], 0, 0, version, rows,
                                  len(payload), b"0123456789abcdef", 0)[:-4]
    return payload + head + struct.pack("<I", zlib.crc32(head, zlib.crc32(payload)))


def _payload(file_bytes):
    return file_bytes[:-container.TRAILER.size]


def _decode(data, name="3.arrowstate.delta"):
    return decoding.decode(f"{WHERE}/{name}", CONTEXT, data, _schema())


def test_crafted_string_offsets_are_an_error_not_a_crash():
    state = VersionedState([pa.field("k", pa.string())], [])
    good = pa.array(["a", "bb", "ccc"])
    offsets = pa.py_buffer(np.array([0, 1, 1 << 30, 6], dtype=np.int32).tobytes())
    bad = pa.Array.from_buffers(pa.string(), 3, [None, offsets, good.buffers()[2]])
    batch = files.with_op(pa.RecordBatch.from_arrays([bad], names=["k0"]), files.OP_PUT)
    data, _ = encoding.encode(state.schema, "delta", 3, [batch])
    with pytest.raises(CorruptStateFile, match="Arrow data is invalid") as e:
        decoding.decode(f"{WHERE}/3.arrowstate.delta", CONTEXT, data, state.schema)
    assert WHERE in str(e.value) and "operator 0, partition 3" in str(e.value)


def test_wrong_schema_huge_lengths_and_lying_trailers_are_errors():
    written, _ = _history(compact=False)
    payload = _payload(written["3.arrowstate.delta"])
    other = VersionedState([pa.field("k", pa.int64())], [])
    other.put_rows([1], pa.RecordBatch.from_arrays([pa.array([1])], ["k"]))
    foreign = other.commit_files(3, 100).written()
    with pytest.raises(CorruptStateFile, match="columns"):
        decoding.decode(f"{WHERE}/3.arrowstate.delta", CONTEXT, foreign["3.arrowstate.delta"],
                        _schema(), read_columns=foreign.get)
    # a message length of 2 GiB - 1, checksum made valid: an error, no allocation
    huge = bytearray(payload)
    huge[4:8] = struct.pack("<i", 0x7FFFFFFF)
    with pytest.raises(CorruptStateFile, match="invalid"):
        _decode(_reframe(bytes(huge), rows=0))
    with pytest.raises(CorruptStateFile, match="rows but its trailer says 999"):
        _decode(_reframe(payload, rows=999))
    with pytest.raises(CorruptStateFile, match="not this file's delta of version 4"):
        _decode(written["3.arrowstate.delta"], "4.arrowstate.delta")
    with pytest.raises(CorruptStateFile, match="format 5"):
        _decode(_reframe(payload, fmt=5))
    with pytest.raises(CorruptStateFile, match="the file is empty"):
        _decode(b"")
    with pytest.raises(CorruptStateFile, match="not written by arrowstate"):
        _decode(b"PAR1" + b"\0" * 100)


def test_format_1_files_still_load():
    """Files as arrowstate 0.1 wrote them: the IPC stream alone, tagged format 1."""
    written, expected = _history(versions=3, every=100, compact=False)
    legacy = {}
    for name, data in written.items():
        reader = pa.ipc.open_stream(_payload(data))
        meta = dict(reader.schema.metadata)
        meta[b"format"] = files.FORMAT
        schema = reader.schema.with_metadata(meta)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, schema) as w:
            for b in reader:
                w.write_batch(pa.RecordBatch.from_arrays(b.columns, schema=schema))
        legacy[name] = sink.getvalue().to_pybytes()
    assert _rows(_load(legacy, 3)) == expected[3]


def test_a_damaged_newest_snapshot_is_repaired_around_with_a_warning(capfd):
    written, expected = _history(versions=10, every=4)
    assert {"4.arrowstate.snapshot", "8.arrowstate.snapshot"} <= set(written)
    damaged = dict(written)
    damaged["8.arrowstate.snapshot"] = written["8.arrowstate.snapshot"][:-1] + b"\0"
    state = _load(damaged, 10)
    assert _rows(state) == expected[10] and state.files_skipped == 1
    assert "skipping damaged snapshot ck/state/0/3/8.arrowstate.snapshot" in capfd.readouterr().err
    # pruning never counts on it: only the good snapshot may free older files
    assert state.lifecycle.snapshots == {4: "4.arrowstate.snapshot"}
    damaged["4.arrowstate.snapshot"] = b"junk"
    assert _rows(_load(damaged, 10)) == expected[10]   # from the deltas alone


def test_no_chain_is_an_error_naming_what_is_missing_or_damaged():
    written, _ = _history(versions=10, every=4)
    gone = {n: b for n, b in written.items() if n != "9.arrowstate.delta"}
    with pytest.raises(MissingStateFiles, match="ck/state/0/3/9.arrowstate.delta") as e:
        _load(gone, 10)
    assert "operator 0, partition 3" in str(e.value)
    pruned = {n: b for n, b in written.items() if file_names.is_columns_file(n)
              or file_names.parse_name(n)[0] >= 4 or n.endswith("snapshot")}
    pruned["4.arrowstate.snapshot"] = pruned["8.arrowstate.snapshot"] = b"junk"
    with pytest.raises(CorruptStateFile, match="every snapshot that could load version 10"):
        _load(pruned, 10)
    bad_delta = dict(written)
    bad_delta["10.arrowstate.delta"] = written["10.arrowstate.delta"][:-2]
    with pytest.raises(CorruptStateFile, match="10.arrowstate.delta"):
        _load(bad_delta, 10)


def test_each_file_has_its_own_unique_id():
    written, _ = _history(versions=3, every=100)
    ids = {container.unique_id(b) for n, b in written.items() if file_names.parse_name(n)}
    assert len(ids) == 3 and None not in ids
    state = _load(written, 3)
    assert state.last_uid == container.unique_id(written["3.arrowstate.delta"])


def test_state_in_memory_is_reused_only_while_the_checkpoint_holds_its_delta():
    from arrowstate.store.lineage import committed_here

    written, _ = _history(versions=3, every=100)
    state = _load(written, 3)
    assert committed_here(state, DictFiles(written))
    rewritten = dict(written)   # another attempt or executor wrote version 3 again
    rewritten["3.arrowstate.delta"], _ = encoding.encode(state.schema, "delta", 3, [])
    assert not committed_here(state, DictFiles(rewritten))
    del rewritten["3.arrowstate.delta"]
    assert not committed_here(state, DictFiles(rewritten))


def test_strings_that_are_not_utf8_load_as_spark_keeps_them():
    """cast(binary as string) gives Spark strings of any bytes; their offsets are still
    checked in full."""
    state = VersionedState([pa.field("k", pa.string())], [])
    raw = pa.array([b"\xff\xfe", b"ok"], pa.binary()).view(pa.string())
    batch = files.with_op(pa.RecordBatch.from_arrays([raw], names=["k0"]), files.OP_PUT)
    data, _ = encoding.encode(state.schema, "delta", 1, [batch])
    batches, _ = decoding.decode(f"{WHERE}/1.arrowstate.delta", CONTEXT, data, state.schema)
    assert batches[0].column(0).view(pa.binary()).to_pylist() == [b"\xff\xfe", b"ok"]


def test_empty_batches_and_an_empty_snapshot_load():
    """A file may hold empty batches (the snapshot of an empty partition, written by
    `state import`): they load as nothing, around the rows of the other batches."""
    schema = _state().schema
    empty = files.with_op(pa.RecordBatch.from_pylist([], schema=schema), files.OP_PUT)
    snapshot, _ = encoding.encode(schema, file_names.SNAPSHOT, 2, [empty])
    assert len(_load({file_names.file_name(file_names.SNAPSHOT, 2): snapshot}, 2)) == 0
    written, expected = _history(versions=3, compact=False)
    full = written[file_names.file_name(file_names.DELTA, 3)]
    batches, _ = decoding.decode("3.arrowstate.delta", "test", full, schema)
    padded, _ = encoding.encode(schema, file_names.DELTA, 3, [empty, *batches, empty])
    written[file_names.file_name(file_names.DELTA, 3)] = padded
    assert _rows(_load(written, 3)) == expected[3]


def test_change_records_are_no_state_and_only_format_3_deltas_hold_them():
    """Change records (what each state operation did, for Spark's change feed) ride in a
    delta beside its puts and removes: a load passes over them, the delta is format 3, and
    a format 2 delta or any snapshot holding one is refused."""
    written, expected = _history(versions=3, compact=False)
    schema = _state().schema
    name = file_names.file_name(file_names.DELTA, 3)
    batches, _ = decoding.decode(name, "test", written[name], schema)
    rows = pa.RecordBatch.from_arrays(batches[0].columns[:-1], schema=schema)
    ops = pa.array([files.CHANGE_UPDATE, files.CHANGE_APPEND, files.CHANGE_DELETE]
                   * rows.num_rows, pa.int8()).slice(0, rows.num_rows)
    state = _state()
    state.record_changes(rows, ops)
    record_batch = state._changes[0]
    with_records, _ = encoding.encode(schema, file_names.DELTA, 3, [*batches, record_batch],
                                      changes=True)
    assert container.TRAILER.unpack(with_records[-container.TRAILER.size:])[1] == 3
    assert _rows(_load(dict(written, **{name: with_records}), 3)) == expected[3]
    as_format_2, _ = encoding.encode(schema, file_names.DELTA, 3, [*batches, record_batch])
    with pytest.raises(CorruptStateFile, match="values other than 0 to 1"):
        _decode(as_format_2)
    snapshot, _ = encoding.encode(schema, file_names.SNAPSHOT, 3, [record_batch], changes=True)
    with pytest.raises(CorruptStateFile, match="values other than 0 to 1"):
        _decode(snapshot, file_names.file_name(file_names.SNAPSHOT, 3))


def test_small_deltas_name_their_columns_file_and_large_ones_carry_their_schema():
    """A delta of a few rows (format 4) holds its rows only and names the columns file its
    partition keeps once; a delta over COMPACT_MAX_BYTES holds its schema (format 2). Both
    load; the columns file is written with the first delta that needs it only."""
    state, written = _state(), {}
    columns_files = []
    for v, n in ((1, 6), (2, 6), (3, 200), (4, 6)):
        _put(state, v, n)
        with mock.patch.object(files, "COMPACT_MAX_BYTES", 4096):   # 6 rows: about 900 B
            done = state.commit_files(v, 100)
        columns_files.append(done.columns_file and done.columns_file[0])
        written.update(done.written())
        state.mark_committed(v, 100)
    expected = _rows(state)
    formats = [container.TRAILER.unpack(written[file_names.file_name(file_names.DELTA, v)][-60:])[1]
               for v in (1, 2, 3, 4)]
    assert formats == [container.FORMAT_COMPACT, container.FORMAT_COMPACT, container.FORMAT_VERSION,
                       container.FORMAT_COMPACT]
    assert columns_files[0] and columns_files[1:] == [None, None, None]
    assert len(written["1.arrowstate.delta"]) < 600 < len(written[columns_files[0]])
    assert _rows(_load(written, 4)) == expected
    # a state loaded from the files knows the columns file is there
    loaded = _load(written, 4)
    _put(loaded, 5)
    assert loaded.commit_files(5, 100).columns_file is None


def test_a_compact_deltas_columns_file_missing_or_damaged_is_an_error_naming_it():
    written, expected = _history(versions=3, every=100)
    (columns_file,) = [n for n in written if file_names.is_columns_file(n)]
    assert _rows(_load(written, 3)) == expected[3]
    gone = {n: b for n, b in written.items() if n != columns_file}
    with pytest.raises(CorruptStateFile, match=f"1.arrowstate.delta .*the columns file it "
                                               f"names, {columns_file}, is missing"):
        _load(gone, 3)
    other = VersionedState([pa.field("k", pa.int64())], [])
    other.put_rows([1], pa.RecordBatch.from_arrays([pa.array([1])], ["k"]))
    (other_name, other_bytes), = [
        (n, b) for n, b in other.commit_files(1, 100).written().items()
        if file_names.is_columns_file(n)]
    renamed = dict(gone, **{columns_file: other_bytes})   # another schema under its name
    with pytest.raises(CorruptStateFile, match=f"{WHERE}/{columns_file} .*not the one its "
                                               "name says"):
        _load(renamed, 3)
    flipped = bytearray(written[columns_file])
    flipped[10] ^= 1
    with pytest.raises(CorruptStateFile, match=f"{WHERE}/{columns_file} .*checksum"):
        _load(dict(written, **{columns_file: bytes(flipped)}), 3)


def test_compact_deltas_keep_change_records_and_figures():
    schema = _state().schema
    state = _state()
    _put(state, 1)
    rows = pa.RecordBatch.from_arrays(state._changes[0].columns[:-1], schema=schema)
    state.record_changes(rows, pa.array([files.CHANGE_UPDATE] * rows.num_rows, pa.int8()))
    figures = {"numTotalStateRows": 6, "numUpdatedStateRows": 300, "numRemovedStateRows": 0}
    written = state.commit_files(1, 100, figures).written()
    delta = written["1.arrowstate.delta"]
    assert container.TRAILER.unpack(delta[-60:])[1:4] == (container.FORMAT_COMPACT, 0,
                                                          compact.FLAG_CHANGES)
    assert decoding.recorded_figures("1.arrowstate.delta", delta) == figures
    batches, _ = decoding.decode(f"{WHERE}/1.arrowstate.delta", CONTEXT, delta, schema,
                                 read_columns=written.get)
    ops = pa.concat_arrays([b.column(b.num_columns - 1) for b in batches]).to_pylist()
    assert ops == [files.OP_PUT] * 6 + [files.CHANGE_UPDATE] * 6


def test_schemas_that_differ_only_in_column_names_have_their_own_columns_files():
    """pyarrow's schema equality ignores field metadata, where a family names its columns:
    each schema still gets its own columns file."""
    a = pa.schema([pa.field("k0", pa.int64()), pa.field("v0", pa.int64(),
                                                        metadata={files.COLUMN_NAME: b"a"})])
    b = pa.schema([pa.field("k0", pa.int64()), pa.field("v0", pa.int64(),
                                                        metadata={files.COLUMN_NAME: b"b"})])
    assert a == b and compact.columns_file(a)[0] != compact.columns_file(b)[0]
    assert compact.columns_file(a)[0] == compact.columns_file(pa.schema(list(a)))[0]
