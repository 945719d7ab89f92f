"""Where the state tools read and write a checkpoint's files: the local disk (plain paths and
`file:` URIs, with the os module's calls), or any other filesystem Hadoop reaches (`hdfs:`,
`s3a:`, `abfs:`, `gs:` ...) through Hadoop's FileSystem in a Spark session's JVM (py4j),
with that session's Hadoop configuration: the `spark.hadoop.*` settings and the session's
own `fs.*` settings, and the connector jars Spark was given.

`files_for(path)` picks one. A Hadoop filesystem needs a session: the one `bound()` names
(the state tools bind the session they run in), else the active one. Nothing here imports
pyspark or py4j for a local path.
"""
from __future__ import annotations

import contextlib
import mmap
import os
import re
import tempfile
from typing import Protocol

# a URI with a scheme of more than one letter (one letter is a Windows drive)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/")


def scheme(path: str) -> str | None:
    """The path's URI scheme (lower case), None for a plain path."""
    m = _SCHEME.match(path)
    return m.group(1).lower() if m else None


def is_remote(path: str) -> bool:
    """Whether the path is on a filesystem other than the local disk."""
    return scheme(path) not in (None, "file")


class CheckpointFiles(Protocol):
    """A checkpoint's files, whatever holds them. Paths are strings (joined with
    os.path.join, which joins a URI's path too); a missing path raises FileNotFoundError,
    another failure OSError."""

    def listdir(self, path: str) -> list[str]: ...

    def isdir(self, path: str) -> bool: ...

    def exists(self, path: str) -> bool: ...

    def read_bytes(self, path: str) -> bytes: ...

    def read_text(self, path: str) -> str: ...

    def read_mapped(self, path: str) -> bytes | memoryview:
        """A state file's bytes, memory-mapped (a file of any size, never whole in the
        heap; store.formats.decoding decodes either)."""

    def tail(self, path: str, size: int) -> bytes:
        """The file's last `size` bytes (all of a shorter one)."""

    def file_sizes(self, path: str) -> dict[str, int]:
        """The files (not directories) directly in a directory: name -> bytes."""

    def modified_ms(self, path: str) -> int: ...

    def tree_size(self, path: str) -> int:
        """The bytes of every file under a directory."""

    def write_atomic(self, path: str, data: bytes) -> None:
        """The file whole or not at all (replacing one there), its directory made."""

    def rename(self, src: str, dst: str) -> None:
        """Moves a file, replacing one at `dst`."""

    def remove(self, path: str) -> None:
        """Deletes a file; a missing one is no error."""

    def makedirs(self, path: str) -> None: ...

    def absolute(self, path: str) -> str:
        """The path as the tools print it: absolute, or the fully qualified URI."""


class LocalDisk:
    """The local disk, through the os module."""

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def read_bytes(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def read_text(self, path: str) -> str:
        with open(path) as f:
            return f.read()

    def read_mapped(self, path: str) -> bytes | memoryview:
        return mapped(path)

    def tail(self, path: str, size: int) -> bytes:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - size))
            return f.read()

    def file_sizes(self, path: str) -> dict[str, int]:
        with os.scandir(path) as entries:
            return {e.name: e.stat().st_size for e in entries if e.is_file()}

    def modified_ms(self, path: str) -> int:
        return os.stat(path).st_mtime_ns // 1_000_000

    def tree_size(self, path: str) -> int:
        total = 0
        for root, _, names in os.walk(path):
            total += sum(os.path.getsize(os.path.join(root, n)) for n in names)
        return total

    def write_atomic(self, path: str, data: bytes) -> None:
        directory, name = os.path.split(path)
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f".{name}.arrowstate-tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def absolute(self, path: str) -> str:
        return os.path.abspath(path)


def mapped(path: str) -> bytes | memoryview:
    """A local file's bytes as a read-only memory map (an empty file as empty bytes: it
    cannot be mapped)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return b""
        return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))


class CheckpointError(ValueError):
    """A checkpoint that cannot be described; the message says what and where."""


LOCAL = LocalDisk()
# py4j moves a byte array as one message: larger writes go in pieces of this size
_WRITE_PIECE = 8 << 20


class HadoopFiles:
    """Any filesystem Hadoop reaches, through Hadoop's FileSystem in a Spark session's JVM,
    with the session's Hadoop configuration (`sessionState.newHadoopConf()`, made on first
    use). Hadoop keeps one FileSystem per scheme and authority (`FileSystem.get`). Files
    are written as Spark writes checkpoint files: through its CheckpointFileManager's
    atomic output (a temporary file renamed, or an object store's single upload)."""

    def __init__(self, session) -> None:
        self._session = session    # pyspark's SparkSession
        self._conf = None

    @property
    def conf(self):
        if self._conf is None:
            self._conf = self._session._jsparkSession.sessionState().newHadoopConf()
        return self._conf

    @property
    def _jvm(self):
        return self._session._jvm

    def _path(self, path: str):
        return self._jvm.org.apache.hadoop.fs.Path(path)

    def _call(self, path: str, act):
        """act(filesystem, Hadoop path), with Java's errors as Python's."""
        from py4j.protocol import Py4JJavaError

        p = self._path(path)
        try:
            return act(p.getFileSystem(self.conf), p)
        except Py4JJavaError as e:
            error = e.java_exception
            if error.getClass().getName() == "java.io.FileNotFoundException":
                raise FileNotFoundError(2, "no such file or directory", path) from None
            raise OSError(f"{path}: {error.getClass().getName()}: {error.getMessage()}") \
                from None

    def listdir(self, path: str) -> list[str]:
        return [s.getPath().getName()
                for s in self._call(path, lambda fs, p: fs.listStatus(p))]

    def isdir(self, path: str) -> bool:
        try:
            return self._call(path, lambda fs, p: fs.getFileStatus(p).isDirectory())
        except FileNotFoundError:
            return False

    def exists(self, path: str) -> bool:
        return self._call(path, lambda fs, p: fs.exists(p))

    def read_bytes(self, path: str) -> bytes:
        def read(fs, p):
            stream = fs.open(p)
            try:
                return bytes(stream.readAllBytes())
            finally:
                stream.close()
        return self._call(path, read)

    def read_text(self, path: str) -> str:
        return self.read_bytes(path).decode()

    def read_mapped(self, path: str) -> bytes | memoryview:
        """Copied by Hadoop, streamed, to a local temporary file that is then mapped (its
        name removed at once: the mapping keeps it while its bytes are used)."""
        fd, local = tempfile.mkstemp(prefix=".arrowstate-read-", suffix=".tmp")
        os.close(fd)
        try:
            # raw local filesystem: no checksum file beside the copy
            self._call(path, lambda fs, p: fs.copyToLocalFile(
                False, p, self._path(f"file://{local}"), True))
            return mapped(local)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(local)

    def tail(self, path: str, size: int) -> bytes:
        def read(fs, p):
            length = fs.getFileStatus(p).getLen()
            stream = fs.open(p)
            try:
                stream.seek(max(0, length - size))
                return bytes(stream.readAllBytes())
            finally:
                stream.close()
        return self._call(path, read)

    def file_sizes(self, path: str) -> dict[str, int]:
        return {s.getPath().getName(): s.getLen()
                for s in self._call(path, lambda fs, p: fs.listStatus(p)) if s.isFile()}

    def modified_ms(self, path: str) -> int:
        return self._call(path, lambda fs, p: fs.getFileStatus(p).getModificationTime())

    def tree_size(self, path: str) -> int:
        return self._call(path, lambda fs, p: fs.getContentSummary(p).getLength())

    def write_atomic(self, path: str, data: bytes) -> None:
        managers = self._jvm.org.apache.spark.sql.execution.streaming.checkpointing \
            .CheckpointFileManager

        def write(fs, p):
            fs.mkdirs(p.getParent())   # Spark's manager on a FileContext makes none (HDFS)
            out = managers.create(p.getParent(), self.conf).createAtomic(p, True)
            try:
                for i in range(0, len(data), _WRITE_PIECE):
                    out.write(data[i:i + _WRITE_PIECE])
            except BaseException:
                out.cancel()
                raise
            out.close()
        self._call(path, write)

    def rename(self, src: str, dst: str) -> None:
        def move(fs, p):
            target = self._path(dst)
            # HDFS and S3A rename over no file (false, or FileAlreadyExistsException)
            if fs.exists(target):
                fs.delete(target, False)
            if not fs.rename(p, target):
                raise OSError(f"{src}: could not be renamed to {dst}")
        self._call(src, move)

    def remove(self, path: str) -> None:
        self._call(path, lambda fs, p: fs.delete(p, False))

    def makedirs(self, path: str) -> None:
        self._call(path, lambda fs, p: fs.mkdirs(p))

    def absolute(self, path: str) -> str:
        return self._call(path, lambda fs, p: fs.makeQualified(p).toString())


_bound: list[HadoopFiles] = []


@contextlib.contextmanager
def bound(session):
    """While open, checkpoints off the local disk are reached through `session`."""
    _bound.append(HadoopFiles(session))
    try:
        yield _bound[-1]
    finally:
        _bound.pop()


def files_for(path: str) -> CheckpointFiles:
    """The filesystem holding `path`: the local disk, or Hadoop's in the bound session (else
    the active one, with its Hadoop settings as they are now)."""
    if not is_remote(path):
        return LOCAL
    if _bound:
        return _bound[-1]
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is None or getattr(active, "_jsparkSession", None) is None:
        raise CheckpointError(
            f"{path}: a checkpoint on {scheme(path)} is read through Hadoop's FileSystem in a "
            "Spark session, and none is active (`python -m arrowstate state ...` starts one)")
    return HadoopFiles(active)
