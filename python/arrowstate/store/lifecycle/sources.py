"""The files of one partition's directory as a load reads them (`FileSource`: the JVM
serves them to a worker, the checkpoint's filesystem to offline tools), and the columns
files its compact deltas name, each read once (`columns_reader`)."""
from __future__ import annotations

from typing import Callable, Protocol, Sequence


class FileSource(Protocol):
    """The files of one partition's directory, as the JVM serves them."""

    where: str     # the directory, as errors name it
    context: str   # operator, partition and version, as errors name them

    def names(self) -> list[str]: ...

    def read(self, name: str) -> bytes | memoryview:
        """The file's bytes: a large one as a memoryview of a memory-mapped local copy
        (`decoding` decodes either)."""

    def tail(self, name: str, size: int) -> bytes:
        """The file's last `size` bytes (all of a shorter one); empty if it is missing."""


def columns_reader(source: FileSource, names: Sequence[str]
                   ) -> Callable[[str], bytes | None]:
    """For `decoding.decode`: a columns file of the directory (whose files are `names`) by
    name, read once however many deltas name it; None for one it does not hold."""
    present, read = set(names), {}

    def columns(name: str) -> bytes | None:
        if name not in present:
            return None
        if name not in read:
            read[name] = bytes(source.read(name))
        return read[name]
    return columns
