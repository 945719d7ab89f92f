"""contract.json is the one declaration both halves read: the Python half must agree with it
(tests/jvm/unit/ContractTests.scala checks the JVM half; tests/unit/test_docs.py the docs)."""
import contextlib
import json
import os

import pytest

from arrowstate import contract, protocol


def test_nothing_points_outside_the_repository():
    """What the workplace's notes taught belongs in the project's own docs, in its words."""
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    found = []
    for top in ("python", "jvm-shim", "docs", "tests", "scripts", "README.md", "build.sbt"):
        for dirpath, _, names in os.walk(os.path.join(root, top)) if not top.endswith(
                (".md", ".sbt")) else [(root, [], [top])]:
            for name in names:
                if not name.endswith((".py", ".scala", ".md", ".json", ".sbt")):
                    continue
                with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                    text = f.read()
                if any(p in text for p in ("../" + "shared", "shared/" + "reference")):
                    found.append(os.path.join(dirpath, name))
    assert found == []


def test_protocol_tags_come_from_the_contract():
    for name, tag in contract.FRAMES.items():
        assert getattr(protocol, name) == tag
    assert protocol.VERSION == contract.PROTOCOL_VERSION
    assert len(set(contract.FRAMES.values())) == len(contract.FRAMES)


def test_an_undeclared_metric_fails():
    contract.check_reported("deduplicate", {"numDroppedDuplicateRows": 1})
    with pytest.raises(RuntimeError, match="numDroppedDuplicateRows"):
        contract.check_reported("aggregate", {"numDroppedDuplicateRows": 1})
    with pytest.raises(RuntimeError, match="rowsSeen"):
        contract.check_reported("aggregate", {"rowsSeen": 1})


def test_every_declared_entry_is_complete():
    for m in contract.METRICS.values():
        assert m["kind"] in ("sum", "timing", "size") and m["description"]
        assert m["reportedBy"] in ("python", "jvm", "both") and m["owner"] in (
            "spark", "arrowstate")
        assert set(m.get("families", [])) <= set(contract.FAMILIES)
    for s in contract.SETTINGS.values():
        assert s["key"].startswith("spark.arrowstate.") and s["scope"] in ("session", "startup")
    for f in contract.FAMILIES.values():
        assert f["switch"] in contract.SETTINGS
    with open(os.path.join(os.path.dirname(contract.__file__), "contract.json")) as f:
        json.load(f)


def test_every_setting_is_typed_and_its_default_is_of_its_type():
    """The shim refuses what a setting's type does not take (tests/jvm/unit/SettingsTests);
    here the declaration itself: a known type, bounds on integers only, a default the
    type takes, and the docs table saying what each accepts."""
    assert set(contract.SETTING_TYPES) == {"boolean", "integer", "size", "path"}
    table = contract.settings_table()
    for s in contract.SETTINGS.values():
        kind, low, high = s["type"], s.get("min"), s.get("max")
        assert kind in contract.SETTING_TYPES, s["key"]
        assert kind == "integer" or (low is None and high is None), s["key"]
        if kind == "boolean":
            assert s["default"] in ("true", "false"), s["key"]
        elif kind == "integer":
            value = int(s["default"])
            assert (low is None or low <= value) and (high is None or value <= high), s["key"]
        elif kind == "size":
            assert s["default"] == "", s["key"]   # unset: the budget comes from Spark's
        assert f"| `{s['key']}` | {contract.setting_accepts(s)} |" in table
    percent = contract.SETTINGS["spark.arrowstate.worker.stateMemoryPercent"]
    assert contract.setting_accepts(percent) == "integer, 0 to 100"
    assert contract.setting_accepts(contract.SETTINGS["spark.arrowstate.enabled"]) == (
        "`true` or `false`")
    assert contract.setting_accepts({"type": "integer", "max": 9}) == "integer, at most 9"


# -- shapes: payloads (JSON Schema) and frame bodies, checked where they cross --

def _schemas(schema):
    yield schema
    for sub in schema.get("properties", {}).values():
        yield from _schemas(sub)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from _schemas(schema[key])


def test_payload_schemas_use_only_what_both_checkers_implement():
    for name, schema in contract.PAYLOADS.items():
        for s in _schemas(schema):
            assert set(s) <= contract.SCHEMA_KEYWORDS, (name, set(s) - contract.SCHEMA_KEYWORDS)
            if "x-payload" in s:
                families = [s["x-payload"].format(family=f) for f in contract.FAMILIES]
                assert all(p in contract.PAYLOADS for p in families) or (
                    s["x-payload"] in contract.PAYLOADS), s["x-payload"]


def test_every_family_declares_its_operator_payload_and_every_frame_type_is_known():
    assert {f"operator.{f}" for f in contract.FAMILIES} <= set(contract.PAYLOADS)
    for frame in contract.FRAME_SPECS.values():
        for fields in (frame.from_jvm, frame.from_python, frame.reply):
            for _, kind in fields or ():
                assert kind in contract.FRAME_TYPES or (
                    kind.startswith(("json:", "sharedJson:", "optionalJson:"))
                    and kind.partition(":")[2] in contract.PAYLOADS), (frame, kind)


def _executor():
    """What an executor's tasks share (the `executor` payload)."""
    return {"sparkFilesDir": "/tmp", "localDir": "/tmp"}


def _task_context():
    """pyspark's TaskContext as the JVM sends it (the `task` payload)."""
    return {"stageId": 1, "stageAttemptNumber": 0, "partitionId": 1, "attemptNumber": 0,
            "taskAttemptId": 7, "cpus": 1, "localProperties": {}}


def _task_frame(run_text: bytes, task_text: bytes = b"", checkpoint_ids=("", "")) -> bytes:
    """A TASK as the JVM writes it: the task's own fields, then the shared ones."""
    import io
    import json

    f = io.BytesIO()
    protocol.write_int(f, contract.FRAMES["TASK"])
    protocol.write_str(f, "/ck/state/0/1")
    protocol.write_int(f, 1)
    protocol.write_long(f, 3)
    for checkpoint_id in checkpoint_ids:
        protocol.write_str(f, checkpoint_id)
    protocol.write_int(f, 1)
    protocol.write_str(f, "/ck/state/0/9")
    protocol.write_bytes(f, task_text)
    protocol.write_bytes(f, json.dumps(_executor()).encode())
    protocol.write_bytes(f, run_text)
    protocol.write_bytes(f, b"")
    return f.getvalue()


def _run(**operator):
    """What a deduplication's tasks share (the `operatorRun` payload)."""
    return {"family": "deduplicate", "queryRunId": "run", "operatorId": 0,
            "conf": {"minDeltasForSnapshot": 10, "minVersionsToRetain": 100,
                     "maxStateBytes": 0, "stateMemoryPercent": 50,
                     "compressionCodec": "lz4", "verifyHeldState": False,
                     "fileChunkBytes": 4 << 20, "fileMemoryBytes": 64 << 20,
                     "memoryBytes": 0},
            "operator": {"keyCount": 1, "eventTimeIndex": -1, "evictByKey": False,
                         "withinWatermark": False, **operator}}


@pytest.mark.parametrize("payload, change, field", [
    ("executor", lambda e: e.pop("localDir"), "localDir"),
    ("executor", lambda e: e.update(renamed=1), "renamed"),
    ("task", lambda t: t.pop("stageAttemptNumber"), "stageAttemptNumber"),
    ("task", lambda t: t.update(cpus="1"), "cpus"),
    ("operatorRun", lambda r: r.update(operatorId="0"), "operatorId"),
    ("operatorRun", lambda r: r.pop("queryRunId"), "queryRunId"),
    ("operatorRun", lambda r: r["operator"].pop("keyCount"), "operator.keyCount"),
    ("operatorRun", lambda r: r["operator"].update(evictByKey=1), "operator.evictByKey"),
    ("operatorRun", lambda r: r["conf"].update(maxStateBytes=None), "conf.maxStateBytes"),
])
def test_a_payload_that_does_not_match_fails_naming_the_field(payload, change, field):
    from arrowstate.errors import ArrowStateError

    make = {"executor": _executor, "task": _task_context, "operatorRun": _run}[payload]
    contract.check_payload(payload, make())
    value = make()
    change(value)
    with pytest.raises(ArrowStateError) as e:
        contract.check_payload(payload, value)
    assert e.value.condition == "ARROWSTATE_CONTRACT_VIOLATION"
    assert e.value.parameters["payload"] in (payload, "operator.deduplicate", "task")
    assert e.value.parameters["field"] == field


def test_a_shared_json_text_is_checked_once_and_its_value_reused():
    import io
    import json

    from arrowstate.errors import ArrowStateError

    good = json.dumps(_run()).encode()
    _, (*_, first, _) = protocol.receive(io.BytesIO(_task_frame(good)), "TASK")
    _, (*_, again, _) = protocol.receive(io.BytesIO(_task_frame(good)), "TASK")
    assert first == _run() and again is first
    bad = _run()
    bad["operator"].pop("keyCount")
    with pytest.raises(ArrowStateError) as e:   # a new text is checked
        protocol.receive(io.BytesIO(_task_frame(json.dumps(bad).encode())), "TASK")
    assert e.value.parameters["field"] == "operator.keyCount"


def test_a_tasks_binary_fields_and_shared_ones_make_the_header_the_worker_serves():
    import io
    import json

    from arrowstate import worker
    from arrowstate.errors import ArrowStateError

    run = json.dumps(_run()).encode()
    _, body = protocol.receive(io.BytesIO(_task_frame(run)), "TASK")
    header = worker.task_header(*body[:-1])
    assert header == {
        "family": "deduplicate", "stateKey": "/ck/state/0/1", "queryRunId": "run",
        "operatorId": 0, "partitionId": 1, "version": 3, "checkpointId": None,
        "baseCheckpointId": None, "drop": ["/ck/state/0/9"], "task": None,
        "sparkFilesDir": "/tmp", "localDir": "/tmp", "operator": _run()["operator"],
        "conf": _run()["conf"]}
    # under checkpoint format v2, with a TaskContext (a family that runs user code)
    frame = _task_frame(run, json.dumps(_task_context()).encode(), ("id-4", "id-3"))
    header = worker.task_header(*protocol.receive(io.BytesIO(frame), "TASK")[1][:-1])
    assert (header["checkpointId"], header["baseCheckpointId"]) == ("id-4", "id-3")
    assert header["task"] == _task_context()
    bad = {**_task_context(), "cpus": "1"}
    with pytest.raises(ArrowStateError) as e:
        protocol.receive(io.BytesIO(_task_frame(run, json.dumps(bad).encode())), "TASK")
    assert (e.value.parameters["payload"], e.value.parameters["field"]) == ("task", "cpus")


def test_frames_cross_as_declared_and_a_frame_out_of_turn_fails():
    import io

    from arrowstate.errors import ArrowStateError

    f = io.BytesIO()
    snapshots = [("3.arrowstate.snapshot", "/tmp/3.arrowstate.snapshot"),
                 ("5.arrowstate.snapshot", b"small")]
    protocol.send(f, "COMMIT", snapshots, 2,
                  "2.arrowstate.snapshot", ["a.arrowstate.run"], [], "s.schema", b"xy",
                  "4.arrowstate.delta", protocol.Chunks(b"delta", 3))
    protocol.send(f, "COMMITTED", {"numTotalStateRows": 5, "stateMemory": 1 << 40})
    raw = f.getvalue()
    # the declared layout: tag, two (name, local path, content): a local file's path and no
    # content, then a small file's content and no path; prune-below and the snapshot that
    # must exist first, the run files to delete and to keep, the schema file's name and
    # bytes, the delta's name and chunks
    name, path = b"3.arrowstate.snapshot", b"/tmp/3.arrowstate.snapshot"
    assert raw[:4] == contract.FRAMES["COMMIT"].to_bytes(4, "big", signed=True)
    assert raw[4:8] == (2).to_bytes(4, "big")
    assert raw[8:12 + len(name)] == len(name).to_bytes(4, "big") + name
    small_at = 12 + len(name) + 4 + len(path) + 4
    assert raw[small_at - 8 - len(path):small_at] == (
        len(path).to_bytes(4, "big") + path + bytes(4))
    assert raw[small_at:small_at + 4 + len(name) + 4 + 4 + 5] == (
        len(name).to_bytes(4, "big") + b"5.arrowstate.snapshot" + bytes(4)
        + (5).to_bytes(4, "big") + b"small")
    prune_at = small_at + 4 + len(name) + 4 + 4 + 5
    assert raw[prune_at:prune_at + 8 + 4 + 21] == (
        (2).to_bytes(8, "big") + (21).to_bytes(4, "big") + b"2.arrowstate.snapshot")
    deletes_at = prune_at + 8 + 4 + 21
    assert raw[deletes_at:deletes_at + 28] == ((1).to_bytes(4, "big") + (16).to_bytes(4, "big")
                                               + b"a.arrowstate.run" + bytes(4))
    schema_at = deletes_at + 28
    assert raw[schema_at:schema_at + 18] == ((8).to_bytes(4, "big") + b"s.schema"
                                             + (2).to_bytes(4, "big") + b"xy")
    delta_at = schema_at + 18 + 4 + 18
    assert raw[schema_at + 18:delta_at] == (18).to_bytes(4, "big") + b"4.arrowstate.delta"
    assert raw[delta_at:delta_at + 21] == (
        (3).to_bytes(4, "big") + b"del" + (2).to_bytes(4, "big") + b"ta" + bytes(4)
        + contract.FRAMES["COMMITTED"].to_bytes(4, "big"))
    # the metrics: their count, then each one's place in the declared order and its value
    places = {name: i for i, name in enumerate(contract.METRICS)}
    assert raw[delta_at + 21:] == ((2).to_bytes(4, "big")
                                   + places["numTotalStateRows"].to_bytes(4, "big")
                                   + (5).to_bytes(8, "big")
                                   + places["stateMemory"].to_bytes(4, "big")
                                   + (1 << 40).to_bytes(8, "big"))
    assert protocol._read_value(io.BytesIO(raw[delta_at + 21:]), "COMMITTED", "metrics",
                                "metrics") == {"numTotalStateRows": 5, "stateMemory": 1 << 40}
    with pytest.raises(ArrowStateError, match="no metric is declared at place"):
        protocol._read_value(io.BytesIO((1).to_bytes(4, "big") + len(places).to_bytes(4, "big")
                                        + bytes(8)), "COMMITTED", "metrics", "metrics")
    with pytest.raises(ArrowStateError, match="must be Chunks") as e:
        protocol.send(io.BytesIO(), "COMMIT", [], 2, "", [], [], "", b"", "d", b"delta")
    assert e.value.parameters["field"] == "delta"
    for metrics, field in (({"numTotalStateRows": "5"}, "metrics.numTotalStateRows"),
                           ({"stateMemory": 1, "renamed": 1}, "metrics.renamed"),
                           ({"stateMemory": 1 << 63}, "metrics.stateMemory")):
        with pytest.raises(ArrowStateError, match="is not a declared metric") as e:
            protocol.send(io.BytesIO(), "COMMITTED", metrics)
        assert e.value.parameters["field"] == field
    with pytest.raises(ArrowStateError, match="does not send"):
        protocol.send(io.BytesIO(), "TASK", "/ck/state/0/1", 1, 3, "", "", [], None,
                      _executor(), _run(), b"")
    # what the JVM sends, read back: a TASK is expected, a DATA is not
    jvm = io.BytesIO()
    protocol.write_int(jvm, contract.FRAMES["DROP"])
    protocol.write_int(jvm, 2)
    for key in ("a", "b"):
        protocol.write_str(jvm, key)
    jvm.seek(0)
    assert protocol.receive(jvm, "DROP") == ("DROP", [["a", "b"]])
    jvm = io.BytesIO(contract.FRAMES["END"].to_bytes(4, "big"))
    with pytest.raises(ArrowStateError, match="expected TASK from the JVM, got END"):
        protocol.receive(jvm, "TASK")


class _Duplex:
    """A connection: reads what the JVM sent, keeps what the worker answers."""

    def __init__(self, sent: bytes) -> None:
        import io
        self.inbox, self.outbox = io.BytesIO(sent), io.BytesIO()

    def read(self, n):
        return self.inbox.read(n)

    def write(self, b):
        return self.outbox.write(b)

    def flush(self):
        """Nothing is buffered: what the worker writes is in the outbox already."""


def _answers(sent: bytes):
    import io

    from arrowstate.worker import Worker

    conn = _Duplex(sent)
    # the worker sends ERROR, then raises to end its process: its answers are what count
    with contextlib.suppress(Exception):
        Worker().serve(conn)
    out, frames = io.BytesIO(conn.outbox.getvalue()), []
    by_tag = {f.tag: f for f in contract.FRAME_SPECS.values()}
    while out.tell() < len(conn.outbox.getvalue()):
        frame = by_tag[protocol.read_int(out)]
        frames.append((frame.name, [protocol._read_value(out, frame.name, n, k)
                                    for n, k in frame.from_python]))
    return frames


def _hello(version, shim):
    import io
    f = io.BytesIO()
    protocol.write_int(f, contract.FRAMES["HELLO"])
    protocol.write_int(f, version)
    protocol.write_str(f, shim)
    return f.getvalue()


def test_a_connection_opens_with_hello_and_versions_must_match():
    from arrowstate import __version__

    assert _answers(_hello(protocol.VERSION, __version__)) == [
        ("HELLO", [protocol.VERSION, __version__])]
    for version, shim in ((protocol.VERSION - 1, __version__), (protocol.VERSION, "0.0.0")):
        [(name, [error])] = _answers(_hello(version, shim))
        assert name == "ERROR" and error["condition"] == "ARROWSTATE_PROTOCOL_MISMATCH"
        assert error["parameters"]["jvmVersion"] == str(version)
    # anything before HELLO is out of turn
    [(name, [error])] = _answers(contract.FRAMES["END"].to_bytes(4, "big"))
    assert error["condition"] == "ARROWSTATE_CONTRACT_VIOLATION"


def test_arrow_values_are_the_streams_pyarrow_writes_and_read_back_whole():
    import pyarrow as pa

    batch = pa.RecordBatch.from_pydict({
        "k": pa.array([1, None, 3, 4], pa.int64()), "s": pa.array(["a", None, "ccc", "d"]),
        "l": pa.array([[1], [], None, [4, 5]]),
        "st": pa.array([{"x": 1.5}, None, {"x": None}, {"x": 2.0}])})
    coded = pa.array(["a", "b", "a", None]).dictionary_encode()
    with_dictionary = pa.RecordBatch.from_arrays([coded], names=["d"])
    for b in (batch, batch.slice(1, 2), batch.slice(0, 0), with_dictionary):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, b.schema) as w:
            w.write_batch(b)
        assert protocol.batch_to_ipc(b) == sink.getvalue().to_pybytes()
        for _ in range(2):   # the first read learns the schema, the second skips it
            assert protocol.ipc_to_batch(protocol.batch_to_ipc(b)).equals(b)
