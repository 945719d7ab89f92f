"""The Python state worker: started by Spark's Python worker factory in each executor.

One process serves one task at a time and keeps every operator partition it has run in
memory, keyed by its checkpoint directory, so a steady-state micro-batch needs no file read.
A connection opens with HELLO both ways (protocol and package versions); then a task's
conversation (frames and their bodies in contract.json, read and written by protocol.py):
  TASK the task's own fields (binary), the executor's and the operator's shared fields
  (JSON read and checked once per executor and micro-batch), input schema ->
  [LIST_FILES, READ_FILE name ...: the worker reads what it needs] -> READY
  (DATA | LOOKUP | INITIAL_STATE) batch -> DATA answer | NO_DATA   (repeated; LOOKUP only
  reads state)
  END (with the last batch) -> DATA batch* END
  [LIST_FILES: a snapshot naming earlier run files checks they are there] COMMIT snapshots
  of earlier versions, prune-below version, run files to delete, delta; then, without
  waiting for the JVM's write, COMMITTED metrics (a write that fails makes the JVM destroy
  this process, or, where it took the whole delta and let the worker go before writing it,
  have it drop that partition's state with its next task: a version the JVM did not write
  is never used)
The JVM does not wait for READY to send the task's input (a reply to the worker's request
is tagged, and the input frames that came before it are read first: protocol.request); it
sends TASK with the first frame where this worker holds the partition, END with the last
batch, and nothing answers COMMITTED; the worker's frames go out when it waits for the JVM
(arrowstate.connection). So a steady-state task costs one round trip, two where an
aggregation's restore reads state before its save.
A state file crosses in bounded chunks (READ_FILE's content, COMMIT's delta, IMPORT_STATE's
snapshot): one larger than spark.arrowstate.worker.fileMemoryBytes is received into a local
file and memory-mapped, never whole in the worker's heap.
Between tasks: DROP, READ_STATE and IMPORT_STATE requests; PRE_INIT on the driver.
Any exception sends ERROR (condition, parameters, message, traceback) and ends the process:
the JVM fails the task, and the state is reloaded from the checkpoint by whoever runs the
retry.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import gc
import os
import socket
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, BinaryIO

import pyarrow as pa

from . import contract, environment, errors
from .connection import Connection
from . import protocol as p
from ._version import __version__
from .errors import ArrowStateError
from .families import REGISTRY
from .families.transform_with_state.pre_init import run_pre_init
from .spark_state import importing, readers
from .spark_state.filesystems import mapped
from .store.versions.versioned import VersionedState
from .store.formats import container, encoding
from .store.held.budget import give_back_memory, resident_bytes
from .store.held.states import HeldStates
from .store.tier.runs import LocalStateWriteFailed


def received_file(reader: p.ChunkReader, memory_bytes: int, directory: str
                  ) -> bytes | memoryview:
    """A streamed file's bytes: in memory when it is at most `memory_bytes`, else written to
    a temporary file in `directory` as its chunks come and memory-mapped, so that verifying
    and decoding it (store.formats.decoding) read the map, not the heap. The file's name goes
    at once (the mapping keeps its pages until nothing uses them; a worker that dies leaves
    nothing)."""
    parts, size = [], 0
    chunks = reader.chunks()
    for chunk in chunks:
        parts.append(chunk)
        size += len(chunk)
        if size > memory_bytes:
            break
    else:
        return parts[0] if len(parts) == 1 else b"".join(parts)
    path = directory
    try:
        os.makedirs(directory, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix=".received-", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as out:
                out.writelines(parts)
                parts.clear()
                for chunk in chunks:
                    out.write(chunk)
            return mapped(path)
        finally:
            os.unlink(path)
    except OSError as e:
        raise LocalStateWriteFailed(path, e, f"the state file {reader.frame} received "
                                             f"(over {memory_bytes} bytes)") from e


class JvmFiles:
    """The partition's state files, listed and read through the JVM (Hadoop's filesystem);
    a file over `memory_bytes` is received into `local_dir` (received_file). A task's input
    that comes before a request's reply goes to `early` (None outside a task's load)."""

    def __init__(self, f: BinaryIO, where: str, context: str, local_dir: str,
                 memory_bytes: int, early: collections.deque | None = None) -> None:
        self._f, self.where, self.context = f, where, context
        self._local_dir, self._memory_bytes = local_dir, memory_bytes
        self.early = early

    def names(self) -> list[str]:
        return p.request(self._f, "LIST_FILES", early=self.early)[0]

    def read(self, name: str) -> bytes | memoryview:
        return received_file(p.request(self._f, "READ_FILE", name, early=self.early)[0],
                             self._memory_bytes, self._local_dir)

    def tail(self, name: str, size: int) -> bytes:
        return p.request(self._f, "FILE_TAIL", name, size, early=self.early)[0]


@functools.lru_cache(maxsize=64)
def input_schema(ipc: bytes) -> pa.Schema:
    """A TASK's input schema: the same bytes for an operator's every task, read once."""
    return p.ipc_schema(ipc)


def received_dir(local_dir: str) -> str:
    """Where state files over spark.arrowstate.worker.fileMemoryBytes are received."""
    return os.path.join(local_dir, "received")


def task_family(header: dict[str, Any], input_schema: pa.Schema):
    """The task's family, made in the environment pyspark's own worker gives Python code
    (set before any user code loads; a family that runs none needs none)."""
    if contract.FAMILIES[header["family"]].get("userCode"):
        if header["task"] is not None:
            environment.set_task_context(header["task"])
        environment.set_spark_files(header["sparkFilesDir"],
                                    header["operator"].get("pythonIncludes", []))
    return REGISTRY[header["family"]](header["operator"], input_schema)


def task_header(state_key: str, partition_id: int, version: int, checkpoint_id: str,
                base_checkpoint_id: str, drop: list[str], task: dict[str, Any] | None,
                executor: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """TASK's fields as one task header: the task's own, the executor's and the operator
    run's (contract.json's TASK names each; a checkpoint id is None where it is empty)."""
    return {"family": run["family"], "stateKey": state_key, "queryRunId": run["queryRunId"],
            "operatorId": run["operatorId"], "partitionId": partition_id, "version": version,
            "checkpointId": checkpoint_id or None,
            "baseCheckpointId": base_checkpoint_id or None, "drop": drop, "task": task,
            "sparkFilesDir": executor["sparkFilesDir"], "localDir": executor["localDir"],
            "operator": run["operator"], "conf": run["conf"]}


class Worker:
    def __init__(self) -> None:
        self.held = HeldStates()   # the partitions' states, and the memory budget
        self.reported: dict[tuple, int] = {}   # (run, operator) -> version RSS was sent for

    def serve_task(self, f: BinaryIO, header: dict[str, Any], input_schema: pa.Schema) -> None:
        """TASK: the partition's state made ready, the task's batches answered, its delta
        committed through the JVM, its metrics sent. What the store keeps, where, and within
        what memory is the held states' to decide (store.held.states)."""
        self.held.forget(header["drop"])
        family = task_family(header, input_schema)
        self.held.configure(header)
        files = JvmFiles(f, header["stateKey"], f"operator {header['operatorId']}, partition "
                                                f"{header['partitionId']}, version "
                                                f"{header['version']}",
                         received_dir(header["localDir"]), header["conf"]["fileMemoryBytes"],
                         early=collections.deque())
        state, metrics = self.ready_state(family, header, files)
        p.send(f, "READY")   # (sent once the worker waits: arrowstate.connection)
        self.answer_batches(f, family, state, files.early)
        commit_ms = self.commit(f, family, state, header)
        self.report(f, family, state, header, metrics, commit_ms)
        if state.snapshot_waits():   # a small one, made once the task's answers went
            f.flush()
            state.make_waiting_snapshot()

    def ready_state(self, family, header: dict[str, Any],
                    files: JvmFiles) -> tuple[VersionedState, dict[str, int]]:
        """The partition's state at the task's version: the one held here when it is
        provably what the checkpoint holds, else loaded from the files; the load's metrics."""
        key, version, run_id = header["stateKey"], header["version"], header["queryRunId"]
        metrics = {"stateCacheHits": 0, "stateCacheMisses": 0, "stateLoadTimeMs": 0,
                   "stateSnapshotsSkipped": 0}
        base_id = header.get("baseCheckpointId")
        state = self.held.reusable(key, version, run_id, files,
                                   header["conf"]["verifyHeldState"], base_id)
        if state is not None:
            metrics["stateCacheHits"] = 1
            family.keep_columns(state.schema)
            return state, metrics
        metrics["stateCacheMisses"] = 1
        start = time.perf_counter()
        if family.named_columns and version > 0:
            try:
                family.keep_columns(readers.stored_schema(files, version,
                                                          checkpoint_id=base_id))
            except container.CorruptStateFile:
                pass   # damage is the load's to handle (it may load older files)
        state = self.held.new_state(family, key)
        state.run_id = run_id
        if version > 0:   # under checkpoint format v2, the lineage the commit log names
            state.load(files, version, checkpoint_id=base_id)
            metrics["stateSnapshotsSkipped"] = state.files_skipped
        family.rebuild_index(state)
        metrics["stateLoadTimeMs"] = int((time.perf_counter() - start) * 1000)
        return state, metrics

    def answer_batches(self, f: BinaryIO, family, state: VersionedState,
                       early: collections.deque) -> None:
        """Each DATA, LOOKUP and INITIAL_STATE frame answered until END (those that came
        while the state loaded, `early`, first); then the family's last batches (evictions,
        timeouts, output held back)."""
        handlers = {"DATA": family.process, "LOOKUP": family.lookup,
                    "INITIAL_STATE": family.initial_state}
        while (frame := early.popleft() if early else p.receive(f, *p.TASK_INPUT))[0] != "END":
            answer = handlers[frame[0]](state, p.ipc_to_batch(frame[1][0]))
            if answer is None:
                p.send(f, "NO_DATA")
            else:
                p.send(f, "DATA", p.batch_to_ipc(answer))
        for batch in family.finish(state):
            p.send(f, "DATA", p.batch_to_ipc(batch))
        p.send(f, "END")

    def commit(self, f: BinaryIO, family, state: VersionedState,
               header: dict[str, Any]) -> int:
        """The state's next version: its delta (with the snapshots and pruning due) sent for
        the JVM to write, and the state marked committed and held for the next task without
        waiting for that write: when it fails, the JVM destroys this process or has it
        drop the partition's state, so a version it did not write is never used. The time
        the delta took to encode (ms)."""
        version, conf = header["version"], header["conf"]
        codec = encoding.ipc_codec(conf["compressionCodec"])
        self.held.check_cap(state, header)
        # rows as Spark counts them: stored rows, unless the family counts otherwise
        family.metrics.setdefault("numTotalStateRows", len(state))
        start = time.perf_counter()
        done = state.commit_files(
            version + 1, int(conf["minVersionsToRetain"]),
            {k: family.metrics.get(k, 0) for k in container.STATE_FIGURES}, codec,
            lambda: p.request(f, "LIST_FILES")[0], header.get("checkpointId"))
        commit_ms = int((time.perf_counter() - start) * 1000)
        name, content = done.columns_file or ("", b"")
        p.send(f, "COMMIT", done.snapshots, done.prune_below, done.prune_snapshot,
               done.delete, done.keep_runs, name, content, done.delta_name,
               p.Chunks(done.delta, conf["fileChunkBytes"]))
        state.mark_committed(version + 1, int(conf["minDeltasForSnapshot"]),
                             os.path.join(header["localDir"], "snapshots"), codec)
        self.held.keep(state, header, family.rebuild_index)
        return commit_ms

    def report(self, f: BinaryIO, family, state: VersionedState, header: dict[str, Any],
               metrics: dict[str, int], commit_ms: int) -> None:
        """COMMITTED: the task's metrics (the load's, the family's, the state's size)."""
        metrics.update(family.metrics)
        metrics["stateMemory"] = state.memory_bytes()
        metrics["stateDiskBytes"] = state.disk_bytes()
        metrics["commitTimeMs"] = commit_ms
        # each worker counts once per operator and batch, so the sum over tasks is the
        # resident memory of the workers that ran them
        operator = (header["queryRunId"], header["operatorId"])
        first = self.reported.get(operator) != header["version"]
        metrics["pythonWorkerRssBytes"] = resident_bytes() if first else 0
        self.reported[operator] = header["version"]
        contract.check_reported(family.name, metrics)
        p.send(f, "COMMITTED", metrics)

    def read_state(self, f: BinaryIO, request: dict[str, Any]) -> None:
        """READ_STATE: one committed version of a partition (or the changes up to it), for
        Spark's state readers, in the key and value schemas Spark records for the operator.
        Loaded apart from (and never kept beside) the state tasks use."""
        files = JvmFiles(f, request["where"], request["context"],
                         received_dir(request["localDir"]), request["fileMemoryBytes"])
        by_name = request.get("stateEncoding") == "avro"   # store.formats.evolution
        ckpt = request.get("checkpointId")   # format v2: the commit log's id of `version`
        if "changesFrom" in request and "columnFamily" in request:
            batches = readers.read_column_family_changes(
                files, request["changesFrom"], request["version"], request["columnFamily"],
                request["keySchema"], request["valueSchema"], by_name, ckpt)
        elif "changesFrom" in request:
            batches = readers.read_changes(files, request["changesFrom"], request["version"],
                                           request["keySchema"], request["valueSchema"], ckpt)
        elif "columnFamily" in request:   # a transformWithState variable
            batches = readers.read_column_family(
                files, request["version"], request["columnFamily"], request["keySchema"],
                request["valueSchema"], request.get("snapshot"), by_name, ckpt)
        else:
            batches = readers.read_state(files, request["version"], request["keySchema"],
                                         request["valueSchema"], request.get("snapshot"), ckpt)
        for batch in batches:
            p.send(f, "DATA", p.batch_to_ipc(batch))
        p.send(f, "END")
        f.flush()

    def import_state(self, f: BinaryIO, request: dict[str, Any], schema: pa.Schema) -> None:
        """IMPORT_STATE: rows of Spark's own state store in Spark's key and value schemas,
        answered with the arrowstate snapshot of the version that holds them."""
        batches = []
        while (frame := p.receive(f, "DATA", "END"))[0] == "DATA":
            batches.append(p.ipc_to_batch(frame[1][0]))
        snapshot = importing.snapshot(request["version"], request["valueSchema"], batches,
                                      schema, request.get("checkpointId"))
        p.send(f, "IMPORT_STATE", p.Chunks(snapshot, request["fileChunkBytes"]))
        f.flush()

    def pre_init(self, f: BinaryIO, request: dict[str, Any]) -> None:
        """PRE_INIT: a transformWithState processor's init() for Spark's planning on the
        driver (families.transform_with_state.pre_init); a worker that runs it serves no
        task after."""
        environment.set_spark_files(request["sparkFilesDir"], request["pythonIncludes"])
        run_pre_init(request)
        p.send(f, "PRE_INIT")
        f.flush()

    def drop(self, f: BinaryIO, state_keys: list[str]) -> None:
        """DROP: forgets partitions' state (stopped queries, partitions held elsewhere) and
        gives the memory back."""
        self.held.forget(state_keys)
        give_back_memory()
        p.send(f, "DROP", resident_bytes())
        f.flush()

    def serve(self, f: BinaryIO) -> None:
        greeted = False
        while True:
            try:
                name, body = p.receive(f, *(("TASK", "DROP", "READ_STATE", "IMPORT_STATE",
                                             "PRE_INIT") if greeted else ("HELLO",)))
                if name == "HELLO":
                    greet(f, *body)
                    greeted = True
                elif name == "TASK":
                    self.serve_task(f, task_header(*body[:-1]), input_schema(body[-1]))
                elif name == "DROP":
                    self.drop(f, body[0])
                elif name == "READ_STATE":
                    self.read_state(f, body[0])
                elif name == "PRE_INIT":
                    self.pre_init(f, body[0])
                else:
                    self.import_state(f, body[0], p.ipc_schema(body[1]))
            except EOFError:
                return
            except BaseException as e:
                send_error(f, e)
                raise


def greet(f: BinaryIO, jvm_version: int, shim_version: str) -> None:
    """HELLO: the worker answers with its versions, or fails when the JVM's differ (a shim
    jar and a Python package of different builds)."""
    if jvm_version != p.VERSION or shim_version != __version__:
        raise ArrowStateError(
            "ARROWSTATE_PROTOCOL_MISMATCH",
            f"the JVM shim speaks protocol {jvm_version} (shim {shim_version}) but the Python "
            f"package speaks {p.VERSION} (package {__version__}); install one build of both "
            "(`python -m arrowstate build` rebuilds the jar)",
            jvmVersion=jvm_version, workerVersion=p.VERSION, shimVersion=shim_version,
            packageVersion=__version__)
    p.send(f, "HELLO", p.VERSION, __version__)


def send_error(f: BinaryIO, e: BaseException) -> None:
    """ERROR: the failure's condition, parameters, message and traceback."""
    p.send(f, "ERROR", errors.error_payload(e))
    f.flush()


def exit_with_parent(interval: float = 1.0) -> None:
    """Ends this process once its parent (the executor JVM) is gone, even while a user's
    function runs: a killed executor leaves no worker behind holding memory. (A parent-death
    signal would follow the JVM thread that started us, which may end long before the JVM.)"""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="arrowstate-parent-watch", daemon=True).start()


# The garbage collector's thresholds in a worker. Python's default (700, 10, 10) runs a young
# collection every 700 allocations, and the full ones that follow scan every object a
# worker's state holds. State is long-lived and rarely cyclic, so rarer collections cost
# memory only for cycles, and those little (`scripts/bench.py --cases tws_rows_value_count`
# shows the difference; docs/performance.md).
GC_THRESHOLDS = (10_000, 10, 10)


def import_what_functions_need() -> None:
    """A user function's worker imports pandas and pyspark's streaming modules before its
    first request: started ahead of a query run (a spare), it is then ready at once."""
    import pandas  # noqa: F401
    from pyspark.sql import conversion  # noqa: F401
    from pyspark.sql.pandas import types  # noqa: F401
    from pyspark.sql.streaming import (state, stateful_processor,  # noqa: F401
                                       stateful_processor_api_client)


def main() -> None:
    """A worker Spark's factory started by itself (`python -m arrowstate.worker`): it
    connects back to the factory, then serves."""
    # Spark's own post-mortem: a crash's traceback goes to PYTHON_FAULTHANDLER_DIR/<pid>,
    # which the JVM reads (PythonWorkerHandle.terminationDiagnostics) when we exit unasked
    fault_log = environment.enable_fault_log()
    from pyspark.util import local_connect_and_auth

    conn_info = os.environ.get("PYTHON_WORKER_FACTORY_SOCK_PATH",
                               int(os.environ.get("PYTHON_WORKER_FACTORY_PORT", -1)))
    sock_file, sock = local_connect_and_auth(conn_info,
                                             os.environ.get("PYTHON_WORKER_FACTORY_SECRET"))
    sock.settimeout(None)
    no_delay(sock)
    p.write_int(sock_file, os.getpid())
    sock_file.flush()
    sys.exit(run(Connection(sock), fault_log))


def no_delay(sock: socket.socket) -> None:
    """Small frames (answers, COMMITTED) go at once on a TCP connection."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def run(sock_file: BinaryIO, fault_log: Any) -> int:
    """Serves the JVM on a connected worker socket (a Connection: what the worker writes
    goes out when it waits for the JVM) until it closes; the exit code."""
    exit_with_parent()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        environment.limit_memory()
        if os.environ.get("ARROWSTATE_FUNCTION_WORKER") == "1":
            import_what_functions_need()
    except BaseException:
        # the task waiting for this worker is told why it cannot start, in its own error
        failed_to_start(sock_file, fault_log)
        return 0
    try:
        Worker().serve(sock_file)
    except BaseException:
        environment.record_fault(fault_log, traceback.format_exc())
        return 1
    environment.close_fault_log(fault_log)
    return 0


def failed_to_start(f: BinaryIO, fault_log: Any) -> None:
    """Sends the startup error as the answer to the first request, then waits for the JVM
    to close the connection (exiting first could reset it before the error is read)."""
    error = sys.exc_info()[1]
    why = (f"the Python state worker could not start ({sys.executable}, pid {os.getpid()}): "
           f"{type(error).__name__}: {error}")
    environment.record_fault(fault_log, f"arrowstate: {why}\n{traceback.format_exc()}")
    with contextlib.suppress(OSError):   # the JVM already closed it: nobody to tell
        send_error(f, errors.ArrowStateError(
            errors.FAILED_TO_START, why, pythonExec=sys.executable, error=str(error)))
        while f.read(1 << 16):   # what the JVM sends meanwhile is dropped unread
            continue


if __name__ == "__main__":
    main()
