"""A snapshot of one committed version, encoded off the micro-batch's path: every live row as
one snapshot file, or for a tier a manifest naming its runs' files (`formats.manifest`),
only the runs no earlier snapshot wrote. A large one is encoded in a thread of its own while
tasks go on; a small one (at most INLINE_MAX_BYTES of state) by the worker once its task's
answers went, before it waits for the next task: a thread costs more than such a snapshot
(its start, and the interpreter's lock passed back and forth with the task's thread). A
worker writes a large one to local files a batch at a time (the JVM copies them into the
checkpoint), so it is never whole in memory; a small one, and any without a directory
(offline tools, tests), is encoded to bytes, which COMMIT carries: on a small state a local
file's creation, the JVM's copy and its deletion cost more than the snapshot's encoding.
When it is written and what retention keeps is `maintenance`'s."""
from __future__ import annotations

import contextlib
import os
import threading
import uuid
from typing import NamedTuple

from ..formats import encoding, files, manifest
from ..formats.names import SNAPSHOT, checkpoint_uid, file_name
from ..tier.runs import RunFiles

INLINE_MAX_BYTES = 1 << 20   # a state this small is snapshot without a thread


class Made(NamedTuple):
    """A finished snapshot: its files in order, and for a manifest what it wrote."""
    files: list[tuple[str, bytes | str]]
    written: manifest.Written | None


class Snapshot:
    """Encodes a snapshot of one committed version, to local files in `directory` (their
    paths are the result) or to bytes: every live row, or for a tier a manifest and the
    runs not written before. `threaded`: in a thread started now (Arrow's take and IPC
    release the GIL), else, to bytes, when `make` (or `result`) is called."""

    def __init__(self, rows, schema, version: int, directory: str | None, codec: str,
                 seeds: tuple[int, int], checkpoint_id: str | None = None,
                 threaded: bool = True) -> None:
        self.version, self._codec, self._seeds = version, codec, seeds
        self.directory = directory if threaded else None   # (a small one: bytes)
        # under checkpoint format v2 the version's id names the snapshot (`lineage`): only
        # the attempt the commit log names for it can have made one of that name
        self.checkpoint_id = checkpoint_id
        self.name = file_name(SNAPSHOT, version, checkpoint_id)
        self._rows, self._schema = rows, schema
        runs = rows.runs() if hasattr(rows, "runs") else ()
        # the runs' cells for their checkpoint files (`RunFiles`), made here, in the task's
        # thread, before a run can be copied; the snapshot holds them, never the runs
        for run, _ in runs:
            if run.files is None:
                run.files = RunFiles()
        # the runs it names from earlier snapshots: retention keeps their files meanwhile
        self.reused_cells = [run.files for run, _ in runs if run.pieces is not None]
        self.reused = {p.name for cell in self.reused_cells for p in cell.pieces}
        self._made: Made | None = None
        self._local: list[str] = []
        self._error: BaseException | None = None
        self._ran = False
        self._thread = None
        if threaded:
            self._thread = threading.Thread(target=self.run, daemon=True,
                                            name=f"arrowstate-snapshot-{version}")
            self._thread.start()

    def busy(self) -> bool:
        """Whether its thread is still encoding it."""
        return self._thread is not None and self._thread.is_alive()

    def waits(self) -> bool:
        """Whether it is an unthreaded snapshot not made yet."""
        return self._thread is None and not self._ran

    def make(self) -> None:
        """Makes it now if it waits; else waits for its thread."""
        if self._thread is not None:
            self._thread.join()
        elif not self._ran:
            self.run()

    def run(self) -> None:
        self._ran = True
        try:
            if self.directory is not None:
                os.makedirs(self.directory, exist_ok=True)
            if hasattr(self._rows, "runs"):
                written = manifest.write(self._rows.runs(), self._schema, self.version,
                                         self._seeds, self._rows.live, self.directory,
                                         self._codec, self.checkpoint_id)
                self._made = Made(written.files, written)
            else:
                self._made = Made([self._rows_file()], None)
            self._local = [c for _, c in self._made.files if isinstance(c, str)]
        except BaseException as e:  # surfaced by result(), in the task that ships it
            self._error = e
        finally:
            if hasattr(self._rows, "close"):
                self._rows.close()
            self._rows = None

    def _rows_file(self) -> tuple[str, bytes | str]:
        name = self.name
        uid = checkpoint_uid(self.checkpoint_id)
        rows = (files.with_op(b, files.OP_PUT) for b in self._rows.batches(1 << 16))
        if self.directory is None:   # a small state's, as bytes
            batches = list(rows)
            # Arrow compresses each buffer apart, with a codec context made for each (about
            # 15 us): a state of a few KiB costs more to compress than to encode and ship
            tiny = sum(b.get_total_buffer_size() for b in batches) <= files.COMPACT_MAX_BYTES
            data, _ = encoding.encode(self._schema, SNAPSHOT, self.version, batches,
                                      codec=None if tiny else self._codec, uid=uid)
            return name, data
        path = os.path.join(self.directory, f"{uuid.uuid4().hex}-{name}")
        try:
            encoding.encode_to_file(path, self._schema, SNAPSHOT, self.version, rows,
                                    self._codec, uid)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
            raise
        return name, path

    def result(self) -> Made:
        self.make()
        if self._error is not None:
            raise self._error
        return self._made

    def delete_local(self) -> None:
        """Deletes the local files it made (a snapshot not shipped)."""
        delete_local([("", path) for path in self._local])
        self._local = []


def delete_local(entries: list[tuple[str, bytes | str]]) -> None:
    for _, content in entries:
        if isinstance(content, str):
            with contextlib.suppress(FileNotFoundError):
                os.remove(content)
