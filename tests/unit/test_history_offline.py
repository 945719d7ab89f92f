"""`python -m arrowstate state history` on checkpoints built here (no Spark): figures summed
over partitions from what each delta records, the bytes a version loads from, durations,
what is not shown or not available and why, the plot and its optional extra, bad input;
`state describe`'s transformWithState variables from a state schema v3 file."""
import importlib.util
import json
import os
import struct
import subprocess
import sys

import pyarrow as pa
import pytest

from arrowstate.__main__ import main
from arrowstate.spark_state import CheckpointError, format_history, history
from arrowstate.spark_state.transform_with_state import describe_variables
from arrowstate.store.formats import container, encoding, names as file_names
from arrowstate.store.formats import files as store_files
import prerequisites

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64())])
START = 1_700_000_000_000   # batch 0's batchTimestampMs; each batch starts 10 s later


def _delta(version: int, figures: dict | None, rows: int = 1) -> bytes:
    batch = pa.RecordBatch.from_pydict({"k": list(range(rows)), "v": [version] * rows},
                                       schema=SCHEMA)
    data, _ = encoding.encode(SCHEMA, file_names.DELTA, version,
                              [store_files.with_op(batch, store_files.OP_PUT)],
                              figures=figures)
    return data


def _figures(total, updated, removed):
    return {"numTotalStateRows": total, "numUpdatedStateRows": updated,
            "numRemovedStateRows": removed}


def _write(path, data) -> int:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    return len(data)


def _checkpoint(root, committed: int, planned: int | None = None, name="dedupe"):
    """offsets/ for batches 0..planned (default: the committed ones), commits/ for
    0..committed-1, each commit written 1234 ms after its batch started; operator 0's
    metadata names it `name`."""
    planned = committed - 1 if planned is None else planned
    for b in range(planned + 1):
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": START + 10_000 * b, "conf": {}}
        _write(str(root / "offsets" / str(b)), f"v1\n{json.dumps(meta)}\n{{\"logOffset\":{b}}}")
    for b in range(committed):
        path = str(root / "commits" / str(b))
        _write(path, 'v1\n{"nextBatchWatermarkMs":0}')
        end = (START + 10_000 * b + 1234) * 1_000_000
        os.utime(path, ns=(end, end))
    info = {"operatorInfo": {"operatorId": 0, "operatorName": name},
            "stateStoreInfo": [{"storeName": "default", "numColsPrefixKey": 0,
                                "numPartitions": 2}]}
    _write(str(root / "state" / "0" / "_metadata" / "metadata"), f"v1\n{json.dumps(info)}")


def test_figures_are_summed_over_partitions_and_uncommitted_batches_are_left_out(tmp_path):
    _checkpoint(tmp_path, committed=2, planned=2)   # batch 2 planned, never committed
    part = tmp_path / "state" / "0"
    sizes = {}
    for p, figs in enumerate([[(2, 2, 0), (3, 1, 0), (9, 9, 9)],
                              [(1, 1, 0), (0, 1, 2), (9, 9, 9)]]):
        for v, f in enumerate(figs, start=1):   # version 3: batch 2's, not committed
            sizes[p, v] = _write(str(part / str(p) / f"{v}.arrowstate.delta"),
                                 _delta(v, _figures(*f)))
    h = history(str(tmp_path))
    assert h["lastCommittedBatch"] == 1 and h["uncommittedBatches"] == [2]
    assert [b["batchId"] for b in h["batches"]] == [0, 1]
    assert h["operators"] == [{"operatorId": 0, "name": "dedupe", "family": "deduplicate"}]
    first, second = (b["operators"][0] for b in h["batches"])
    assert (first["numRowsTotal"], first["numRowsUpdated"], first["numRowsRemoved"]) == (3, 3, 0)
    assert (second["numRowsTotal"], second["numRowsUpdated"],
            second["numRowsRemoved"]) == (3, 2, 2)
    # what a restart at the batch would load: deltas 1..v of each partition
    assert first["bytesOnDisk"] == sizes[0, 1] + sizes[1, 1]
    assert second["bytesOnDisk"] == sum(sizes[p, v] for p in (0, 1) for v in (1, 2))
    assert [b["durationMs"] for b in h["batches"]] == [1234, 1234]
    assert h["timeResolutionMs"] == 1   # times to the millisecond: taken as they are
    assert h["batches"][1]["batchTimestampMs"] == START + 10_000
    text = format_history(h)
    assert "planned but not committed (not shown): batches 2" in text
    assert "0 dedupe" in text and "\n    2 " not in text


def test_snapshots_pruned_files_old_deltas_and_operators_added_later(tmp_path):
    _checkpoint(tmp_path, committed=4)
    part = tmp_path / "state" / "0" / "0"
    _write(str(part / "1.arrowstate.delta"), _delta(1, _figures(1, 1, 0)))
    _write(str(part / "2.arrowstate.delta"), _delta(2, None))   # an older arrowstate's
    snapshot = _write(str(part / "3.arrowstate.snapshot"), b"x" * 100)
    delta3 = _write(str(part / "3.arrowstate.delta"), _delta(3, _figures(2, 1, 0)))
    delta4 = _write(str(part / "4.arrowstate.delta"), _delta(4, _figures(2, 0, 0)))
    os.remove(part / "1.arrowstate.delta")   # pruned by retention
    # operator 1 first runs in batch 3 (HDFS-backed Spark files)
    later = tmp_path / "state" / "1" / "0"
    spark_snapshot = _write(str(later / "4.snapshot"), b"y" * 50)
    ops = [b["operators"] for b in history(str(tmp_path))["batches"]]
    assert ops[0][0]["numRowsTotal"] is None and "no state files of this batch's version" in \
        ops[0][0]["note"]
    assert ops[1][0]["numRowsTotal"] is None and "records no figures" in ops[1][0]["note"]
    assert ops[1][0]["bytesOnDisk"] is None and "(pruned by retention)" in ops[1][0]["note"]
    assert ops[2][0]["numRowsTotal"] == 2 and ops[2][0]["bytesOnDisk"] == snapshot
    assert ops[3][0]["bytesOnDisk"] == snapshot + delta4 and delta3 > 0
    assert [o[1]["engine"] for o in ops] == [None, None, None, "spark-hdfs"]
    assert ops[3][1]["numRowsTotal"] is None and "record no state figures" in ops[3][1]["note"]
    assert ops[3][1]["bytesOnDisk"] == spark_snapshot
    assert "no state files of this batch's version" in ops[0][1]["note"]


def test_rocksdb_state_is_named_and_what_is_not_available_is_said(tmp_path):
    _checkpoint(tmp_path, committed=2)
    part = tmp_path / "state" / "0" / "0"
    _write(str(part / "1_0a1b-2c.zip"), b"z")
    _write(str(part / "2_0a1b-2d.changelog"), b"c")
    ops = [b["operators"][0] for b in history(str(tmp_path))["batches"]]
    assert [o["engine"] for o in ops] == ["spark-rocksdb"] * 2
    assert all(o["numRowsTotal"] is None and o["bytesOnDisk"] is None for o in ops)
    assert all("record no state figures" in o["note"] and "RocksDB" in o["note"] for o in ops)


def test_files_moved_aside_by_export_still_give_their_figures(tmp_path):
    _checkpoint(tmp_path, committed=2)
    _write(str(tmp_path / "arrowstate-exported-2" / "state" / "0" / "0" / "1.arrowstate.delta"),
           _delta(1, _figures(4, 4, 0)))
    _write(str(tmp_path / "state" / "0" / "0" / "2.zip"), b"z")   # Spark's, since export
    first, second = (b["operators"][0] for b in history(str(tmp_path))["batches"])
    assert (first["engine"], first["numRowsTotal"], first["bytesOnDisk"]) == (
        "arrowstate", 4, None)
    assert "moved aside to arrowstate-exported-2/" in first["note"]
    assert second["engine"] == "spark-rocksdb"


def test_a_damaged_delta_is_named(tmp_path):
    _checkpoint(tmp_path, committed=1)
    data = bytearray(_delta(1, _figures(1, 1, 0)))
    data[10] ^= 0xFF
    _write(str(tmp_path / "state" / "0" / "0" / "1.arrowstate.delta"), bytes(data))
    with pytest.raises(container.CorruptStateFile, match="1.arrowstate.delta.*checksum"):
        history(str(tmp_path))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "arrowstate", "state", "history", *args],
                          capture_output=True, text=True, timeout=120)


def test_no_commits_is_a_clear_error_and_nothing_is_written(tmp_path):
    _checkpoint(tmp_path, committed=0, planned=0)
    before = sorted(p for p in tmp_path.rglob("*"))
    plot = tmp_path / "out.png"
    # without the plot extra, --plot is refused before the checkpoint is read
    plotting = ["--plot", str(plot)] if importlib.util.find_spec("matplotlib") else []
    done = _cli(str(tmp_path), *plotting)
    assert done.returncode == 2 and done.stdout == ""
    assert "no committed batch" in done.stderr and "batch 0 is planned" in done.stderr
    assert not plot.exists() and sorted(p for p in tmp_path.rglob("*")) == before
    done = _cli(str(tmp_path / "missing"))
    assert done.returncode == 2 and "no such directory" in done.stderr


def test_text_json_and_plot(tmp_path, capsys):
    prerequisites.module("matplotlib", "`state history --plot` draws with it: the `test` extra")
    _checkpoint(tmp_path, committed=3)
    for v in (1, 2, 3):
        _write(str(tmp_path / "state" / "0" / "0" / f"{v}.arrowstate.delta"),
               _delta(v, _figures(v, 1, 0)))
    plot = tmp_path / "history.png"
    assert main(["state", "history", str(tmp_path), "--json", "--plot", str(plot)]) == 0
    assert json.loads(capsys.readouterr().out) == history(str(tmp_path))
    with open(plot, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert not [n for n in os.listdir(tmp_path) if n.endswith("arrowstate-tmp")]
    assert main(["state", "history", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["batch", "duration", "ms", "operator", "rows", "total",
                                "updated", "removed", "bytes", "on", "disk"]
    assert lines[2].split()[:6] == ["0", "1234", "0", "dedupe", "1", "1"]


def test_plot_without_matplotlib_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    _checkpoint(tmp_path, committed=1)
    _write(str(tmp_path / "state" / "0" / "0" / "1.arrowstate.delta"),
           _delta(1, _figures(1, 1, 0)))
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # as if not installed
    plot = tmp_path / "history.png"
    assert main(["state", "history", str(tmp_path), "--plot", str(plot)]) == 2
    out = capsys.readouterr()
    assert "pip install 'arrowstate[plot]'" in out.err and out.out == ""
    assert not plot.exists()
    with pytest.raises(CheckpointError, match=r"arrowstate\[plot\]"):
        from arrowstate.spark_state import plot_history
        plot_history(history(str(tmp_path)), str(plot))


def _utf(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">H", len(data)) + data


def _chunked(text: str) -> bytes:
    return struct.pack(">i", 1) + _utf(text)


def _struct(**fields) -> dict:
    return {"type": "struct", "fields": [
        {"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields.items()]}


def test_describe_names_transform_with_state_variables_and_timers(tmp_path):
    """From the operator metadata and the state schema v3 file Spark writes (its layout:
    column family name, key and value schemas after a 2-byte schema id, encoder specs)."""
    user = _struct(user="string")
    families = {
        "count": (user, _struct(value=_struct(n="long"), ttlExpirationMs="long")),
        "seen": (_struct(key=user, userKey=_struct(v="long")), _struct(c="long")),
        "recent": (user, _struct(n="long")),
    }
    data = _utf("v3") + struct.pack(">i", len(families))
    for name, (key, value) in families.items():
        data += (_utf(name) + b"\0\0" + _chunked(json.dumps(key)) + b"\0\0"
                 + _chunked(json.dumps(value)) + _chunked('{"keyStateEncoderType":"x"}')
                 + _chunked("{    }"))
    op_dir = tmp_path / "state" / "0"
    _write(str(op_dir / "_stateSchema" / "default" / "0_abc"), data)
    props = {"timeMode": "EventTime", "stateVariables": [
        {"stateName": "count", "stateVariableType": "ValueState", "ttlEnabled": True},
        {"stateName": "seen", "stateVariableType": "MapState", "ttlEnabled": False},
        {"stateName": "recent", "stateVariableType": "ListState", "ttlEnabled": False},
        {"stateName": "$eventTimers_keyToTimestamp", "stateVariableType": "TimerState",
         "ttlEnabled": False}]}
    info = {"stateStoreInfo": [{"storeName": "default", "stateSchemaFilePaths": [
        "file:/elsewhere/state/0/_stateSchema/default/0_abc"]}],
        "operatorPropertiesJson": json.dumps(props)}
    variables, timers = describe_variables(str(op_dir), info)
    assert variables == [
        {"name": "count", "kind": "value", "schema": "struct<n:bigint>", "ttl": True},
        {"name": "seen", "kind": "map", "schema": "struct<c:bigint>", "ttl": False,
         "key_schema": "struct<v:bigint>"},
        {"name": "recent", "kind": "list", "schema": "struct<n:bigint>", "ttl": False}]
    assert timers["time_mode"] == "EventTime"
    os.remove(op_dir / "_stateSchema" / "default" / "0_abc")   # without it: no schemas
    variables, _ = describe_variables(str(op_dir), info)
    assert [v["schema"] for v in variables] == [None, None, None]


def test_durations_on_a_store_that_keeps_file_times_to_the_second(tmp_path):
    """S3 keeps an object's time to the second: when every commit's time is a whole second,
    the history says so and takes each commit at the middle of what is left of its second
    after the batch's start."""
    _checkpoint(tmp_path, committed=2)
    # batch 0 ended 1,234 ms after its start: its commit's time, truncated, is the start's
    # second + 1 (START is a whole second); batch 1's commit in the second it started in
    for b, end_ms in ((0, START + 1000), (1, START + 10_000)):
        path = str(tmp_path / "commits" / str(b))
        os.utime(path, ns=(end_ms * 1_000_000, end_ms * 1_000_000))
    h = history(str(tmp_path))
    assert h["timeResolutionMs"] == 1000
    first, second = h["batches"]
    assert first["durationMs"] == 1499                 # within [1000, 1999]: the middle
    assert second["durationMs"] == 499                 # within [0, 999]
    assert "duration ms (±500)" in format_history(h)
    # a batch that started after its commit's second began: the span left after the start
    late = str(tmp_path / "offsets" / "1")
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": START + 10_800, "conf": {}}
    _write(late, f"v1\n{json.dumps(meta)}\n{{\"logOffset\":1}}")
    assert history(str(tmp_path))["batches"][1]["durationMs"] == 99   # within [0, 199]
