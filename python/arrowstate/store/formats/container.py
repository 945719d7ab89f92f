"""A state file's container: its payload, then the 60-byte trailer that makes it
self-verifying (the layout is in `files`), and the error a file that fails it raises.
Formats 2 to 5 share it (`files`, `compact`, `manifest`)."""
from __future__ import annotations

import struct
import uuid
import zlib

from ...errors import ArrowStateError

FORMAT_VERSION = 2
FORMAT_WITH_CHANGES = 3   # a delta holding change records
FORMAT_COMPACT = 4        # a small delta whose schema is in its partition's columns file
FORMAT_MANIFEST = 5       # a snapshot that names run files instead of holding rows
FORMAT_2 = b"arrowstate-state-2"   # the payload's schema tag, formats 2 to 4
KIND_DELTA, KIND_SNAPSHOT, KIND_COLUMNS, KIND_RUN = 0, 1, 2, 3   # the trailer's kind codes
STATE_FIGURES = ("numTotalStateRows", "numUpdatedStateRows", "numRemovedStateRows")
MAGIC = b"ARWSTATE"
TRAILER = struct.Struct("<8sHBBIqqq16sI")
_CRC_AT = TRAILER.size - 4            # the CRC covers everything before it


class CorruptStateFile(ArrowStateError):
    """A state file that cannot be used; the message names it and says what is wrong."""

    def __init__(self, path: str, context: str, what: str,
                 condition: str = "CANNOT_LOAD_STATE_STORE.CORRUPT_STATE_FILE") -> None:
        self.path, self.what = path, what
        super().__init__(
            condition, f"An error occurred during loading state. arrowstate cannot use state "
            f"file {path} ({context}): {what}", path=path, context=context, reason=what)


def trailer(kind_code: int, fmt: int, flags: int, version: int, rows: int, length: int,
            payload_crc: int, uid: bytes | None = None) -> tuple[bytes, bytes]:
    """The trailer after a payload of `length` bytes whose CRC-32 is `payload_crc`, and the
    file's unique id (`uid`, 16 bytes, if given: a checkpoint id; else a new one)."""
    uid = uuid.uuid4().bytes if uid is None else uid
    head = TRAILER.pack(MAGIC, fmt, kind_code, flags, 0, version, rows, length, uid,
                        0)[:_CRC_AT]
    return head + struct.pack("<I", zlib.crc32(head, payload_crc)), uid


def unique_id(payload: bytes) -> bytes | None:
    """The unique id in a file's trailer (the last TRAILER.size bytes will do)."""
    if len(payload) < TRAILER.size or payload[-TRAILER.size:][:8] != MAGIC:
        return None
    return TRAILER.unpack(payload[-TRAILER.size:])[8]


def checked_trailer(payload, bad) -> tuple | None:
    """The trailer's fields (TRAILER's order) once the payload's length and checksum agree
    with it; None for a file without one (format 1). Damage is `bad(what)`."""
    if len(payload) < TRAILER.size or payload[-TRAILER.size:][:8] != MAGIC:
        return None
    fields = TRAILER.unpack(payload[-TRAILER.size:])
    length, crc = fields[7], fields[9]
    if length != len(payload) - TRAILER.size:
        raise bad(f"it holds {len(payload) - TRAILER.size} payload bytes but its trailer "
                  f"says {length} (truncated or appended to)")
    computed = zlib.crc32(memoryview(payload)[length:length + _CRC_AT],
                          zlib.crc32(memoryview(payload)[:length]))
    if computed != crc:
        raise bad(f"checksum mismatch (stored CRC-32 {crc:#010x}, computed {computed:#010x}): "
                  "the file is damaged")
    return fields
