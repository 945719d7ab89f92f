"""A state file's container: its payload, then the 60-byte trailer that makes it
self-verifying (the layout is in `files`), and the error a file that fails it raises.
Formats 2 to 5 share it (`files`, `compact`, `manifest`)."""
from __future__ import annotations

import os
import struct
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
# the trailer's flag (any format): the 16 bytes before the trailer, after the payload and
# under its CRC, are the checkpoint id of the version the file was built on (checkpoint
# format v2: a delta's link in its lineage)
FLAG_BASE = 2
BASE_SIZE = 16


class CorruptStateFile(ArrowStateError):
    """A state file that cannot be used; the message names it and says what is wrong."""

    def __init__(self, path: str, context: str, what: str,
                 condition: str = "CANNOT_LOAD_STATE_STORE.CORRUPT_STATE_FILE") -> None:
        self.path, self.what = path, what
        super().__init__(
            condition, f"An error occurred during loading state. arrowstate cannot use state "
            f"file {path} ({context}): {what}", path=path, context=context, reason=what)


def trailer(kind_code: int, fmt: int, flags: int, version: int, rows: int, length: int,
            payload_crc: int, uid: bytes | None = None, base: bytes | None = None
            ) -> tuple[bytes, bytes]:
    """What follows a payload of `length` bytes whose CRC-32 is `payload_crc` (the base id,
    if given, then the trailer), and the file's unique id (`uid`, 16 bytes, if given: a
    checkpoint id; else a new one). `base`: the checkpoint id (16 bytes) of the version the
    file builds on (FLAG_BASE)."""
    uid = os.urandom(16) if uid is None else uid   # (uuid4's object costs 4x the bytes)
    before = b""
    if base is not None:
        assert len(base) == BASE_SIZE
        flags |= FLAG_BASE
        before = base
        payload_crc = zlib.crc32(base, payload_crc)
    head = TRAILER.pack(MAGIC, fmt, kind_code, flags, 0, version, rows, length, uid,
                        0)[:_CRC_AT]
    return before + head + struct.pack("<I", zlib.crc32(head, payload_crc)), uid


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
    extra = BASE_SIZE if fields[3] & FLAG_BASE else 0
    if length != len(payload) - TRAILER.size - extra:
        raise bad(f"it holds {len(payload) - TRAILER.size - extra} payload bytes but its "
                  f"trailer says {length} (truncated or appended to)")
    computed = zlib.crc32(memoryview(payload)[length:length + extra + _CRC_AT],
                          zlib.crc32(memoryview(payload)[:length]))
    if computed != crc:
        raise bad(f"checksum mismatch (stored CRC-32 {crc:#010x}, computed {computed:#010x}): "
                  "the file is damaged")
    return fields


def base_id(path: str, context: str, tail: bytes) -> bytes | None:
    """The checkpoint id of the version a file was built on (FLAG_BASE), from its last
    TRAILER.size + BASE_SIZE bytes (or all of a shorter file); None for a file that names
    none. A tail that is no trailer is a CorruptStateFile naming `path` (only the whole
    file's checksum, checked when it is read, vouches for the id)."""
    if len(tail) < TRAILER.size or tail[-TRAILER.size:][:8] != MAGIC:
        raise CorruptStateFile(path, context, "it ends in no arrowstate trailer (truncated "
                               "or not a state file)")
    flags = TRAILER.unpack(tail[-TRAILER.size:])[3]
    if not flags & FLAG_BASE:
        return None
    if len(tail) < TRAILER.size + BASE_SIZE:
        raise CorruptStateFile(path, context, "its trailer names a base id the file is too "
                               "short to hold")
    return bytes(tail[-TRAILER.size - BASE_SIZE:-TRAILER.size])
