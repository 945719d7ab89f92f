"""The `chunks` frame type (contract.json `frameTypes`): a state file of any size crosses
between the JVM and the worker as bounded chunks ended by an empty one, and the worker
keeps one over spark.arrowstate.worker.fileMemoryBytes in a memory-mapped local file rather
than in its heap. The JVM's twin is tests/jvm/unit/FramingTests.scala."""
import io
import os

import pyarrow as pa
import pytest

from arrowstate import contract, protocol
from arrowstate.errors import ArrowStateError
from arrowstate.store.formats import container, decoding, encoding, names as file_names
from arrowstate.store.formats import files
from arrowstate.worker import JvmFiles, received_file


def _sent(data: bytes, chunk_bytes: int) -> bytes:
    f = io.BytesIO()
    protocol.write_chunks(f, data, chunk_bytes)
    return f.getvalue()


def _chunk_lengths(raw: bytes) -> list[int]:
    lengths, at = [], 0
    while True:
        n = int.from_bytes(raw[at:at + 4], "big")
        lengths.append(n)
        at += 4 + n
        if n == 0:
            assert at == len(raw)
            return lengths


@pytest.mark.parametrize("size, chunk, lengths", [
    (0, 4, [0]),                   # an empty file: the empty chunk alone
    (10, 4, [4, 4, 2, 0]),
    (12, 4, [4, 4, 4, 0]),         # an exact multiple: no short chunk before the end
    (3, 4, [3, 0]),
    (5, 1, [1, 1, 1, 1, 1, 0]),
])
def test_chunks_round_trip_in_bounded_pieces(size, chunk, lengths):
    data = os.urandom(size)
    raw = _sent(data, chunk)
    assert _chunk_lengths(raw) == lengths
    reader = protocol.ChunkReader(io.BytesIO(raw), "READ_FILE", "content")
    assert reader.read_all() == data and reader.ended


def test_chunks_are_sent_from_any_bytes_like_value_without_a_copy():
    data = pa.py_buffer(b"abcdefg")
    assert _sent(data, 3) == _sent(b"abcdefg", 3) == _sent(memoryview(b"abcdefg"), 3)


@pytest.mark.parametrize("cut", [2, 4, 7, 10])
def test_a_truncated_stream_is_an_error_naming_the_field(cut):
    raw = _sent(b"0123456789", 4)[:cut]   # inside a length, inside a chunk, before the end
    reader = protocol.ChunkReader(io.BytesIO(raw), "READ_FILE", "content")
    with pytest.raises(EOFError, match=r"READ_FILE\.content, before its last chunk"):
        reader.read_all()


def test_a_negative_chunk_length_is_a_contract_violation():
    raw = (-3).to_bytes(4, "big", signed=True)
    with pytest.raises(ArrowStateError, match="a chunk of length -3") as e:
        protocol.ChunkReader(io.BytesIO(raw), "COMMIT", "delta").read_all()
    assert e.value.parameters["field"] == "delta"


def test_a_chunks_field_is_always_the_last_of_its_body():
    """A reader drains a stream before the next frame: nothing may follow it in a body."""
    found = []
    for frame in contract.FRAME_SPECS.values():
        for fields in (frame.from_jvm, frame.from_python, frame.reply):
            kinds = [kind for _, kind in fields or ()]
            if "chunks" in kinds:
                found.append(frame.name)
                assert kinds.index("chunks") == len(kinds) - 1, frame
    assert {"READ_FILE", "COMMIT", "IMPORT_STATE"} <= set(found)


def test_the_chunk_size_and_the_memory_threshold_are_declared_settings():
    for key in ("spark.arrowstate.worker.fileChunkBytes",
                "spark.arrowstate.worker.fileMemoryBytes"):
        assert contract.SETTINGS[key]["type"] == "integer"
        assert key in contract.STORE_CONF.values()   # the header's conf carries them
    assert 1 << 20 <= int(contract.SETTINGS["spark.arrowstate.worker.fileChunkBytes"]
                          ["default"]) < 1 << 31


def _reader(data: bytes, chunk: int = 4) -> protocol.ChunkReader:
    return protocol.ChunkReader(io.BytesIO(_sent(data, chunk)), "READ_FILE", "content")


@pytest.mark.parametrize("size", [0, 7, 8])
def test_a_file_within_the_threshold_is_received_in_memory(tmp_path, size):
    data = os.urandom(size)
    got = received_file(_reader(data), 8, str(tmp_path / "received"))
    assert isinstance(got, bytes) and got == data
    assert not (tmp_path / "received").exists()


def test_a_file_over_the_threshold_is_received_into_a_mapped_file_that_leaves_no_name(
        tmp_path):
    where = tmp_path / "received"
    data = os.urandom(1000)
    got = received_file(_reader(data, 64), 100, str(where))
    assert isinstance(got, memoryview) and got == data
    assert os.listdir(where) == []   # mapped, its name gone


def _file(version=3, rows=500):
    schema = pa.schema([("k", pa.int64()), ("v", pa.string())])
    batch = pa.RecordBatch.from_pylist([{"k": i, "v": f"value {i}"} for i in range(rows)],
                                       schema=schema)
    data, uid = encoding.encode(schema, file_names.DELTA, version,
                                [files.with_op(batch, files.OP_PUT)])
    return schema, batch, data, uid


def test_a_mapped_file_is_verified_and_decoded_as_bytes_are(tmp_path):
    schema, batch, data, uid = _file()
    mapped = received_file(_reader(data, 100), 0, str(tmp_path))
    batches, got_uid = decoding.decode("/ck/3.arrowstate.delta", "test", mapped, schema)
    assert got_uid == uid and container.unique_id(mapped) == uid
    assert pa.Table.from_batches(batches).column("v").to_pylist() == batch.column(1).to_pylist()
    damaged = bytearray(data)
    damaged[len(data) // 2] ^= 0x40
    with pytest.raises(container.CorruptStateFile, match="checksum mismatch"):
        decoding.decode("/ck/3.arrowstate.delta", "test",
                        received_file(_reader(bytes(damaged), 100), 0, str(tmp_path)), schema)
    assert os.listdir(tmp_path) == []


def test_a_received_file_that_cannot_be_written_locally_names_the_path_and_setting(tmp_path):
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    with pytest.raises(ArrowStateError) as e:
        received_file(_reader(os.urandom(100)), 10, str(blocked / "received"))
    assert e.value.condition == "ARROWSTATE_LOCAL_STATE_WRITE_FAILED"
    assert e.value.parameters["setting"] == "spark.arrowstate.worker.localDir"
    assert "not-a-directory" in e.value.parameters["path"]


def _tag(name: str) -> bytes:
    return contract.FRAMES[name].to_bytes(4, "big")


class _Jvm:
    """The JVM's end of READ_FILE: answers one request with a file's chunks (after the
    task's input it sent before reading the request: `before`)."""

    def __init__(self, data: bytes, chunk: int, before: bytes = b"") -> None:
        self.inbox = io.BytesIO(before + _tag("READ_FILE") + _sent(data, chunk))
        self.outbox = io.BytesIO()

    def read(self, n):
        return self.inbox.read(n)

    def write(self, b):
        return self.outbox.write(b)

    def flush(self):
        """Unbuffered."""


def test_the_worker_reads_a_state_file_through_the_jvm_in_chunks(tmp_path):
    schema, batch, data, _ = _file(rows=2000)
    jvm = _Jvm(data, 256)
    source = JvmFiles(jvm, "/ck/state/0/1", "test", str(tmp_path / "received"), 1024)
    got = source.read("3.arrowstate.delta")
    assert isinstance(got, memoryview) and got == data and len(data) > 1024
    request = jvm.outbox.getvalue()
    assert request[:4] == contract.FRAMES["READ_FILE"].to_bytes(4, "big")
    assert request[8:] == b"3.arrowstate.delta"
    assert jvm.inbox.read() == b""   # read to its end: the next frame is the next one's
    assert os.listdir(tmp_path / "received") == []


def _input_frame(name: str, batch: pa.RecordBatch | None = None) -> bytes:
    f = io.BytesIO()
    f.write(_tag(name))
    if batch is not None:
        protocol.write_bytes(f, protocol.batch_to_ipc(batch))
    return f.getvalue()


def test_the_tasks_input_sent_before_a_reply_is_kept_for_the_task_in_order(tmp_path):
    """The JVM sends a task's input without waiting for READY: a file request's reply comes
    after it, and the task reads that input first."""
    import collections

    schema, batch, data, _ = _file(rows=10)
    keys = pa.record_batch([pa.array([1, 2], pa.int64())], names=["k"])
    before = _input_frame("LOOKUP", keys) + _input_frame("DATA", batch) + _input_frame("END")
    early = collections.deque()
    source = JvmFiles(_Jvm(data, 256, before), "/ck/state/0/1", "test",
                      str(tmp_path / "received"), 1024, early=early)
    assert source.read("3.arrowstate.delta") == data
    assert [name for name, _ in early] == ["LOOKUP", "DATA", "END"]
    assert protocol.ipc_to_batch(early[0][1][0]).equals(keys)
    assert protocol.ipc_to_batch(early[1][1][0]).equals(batch)
    # outside a task's load (a state read, a commit), nothing may come before a reply
    source = JvmFiles(_Jvm(data, 256, _input_frame("END")), "/ck/state/0/1", "test",
                      str(tmp_path / "received"), 1024)
    with pytest.raises(ArrowStateError, match="reply to READ_FILE"):
        source.read("3.arrowstate.delta")
