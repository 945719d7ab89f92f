"""The worker's end of its socket to the JVM: buffered both ways, and what the worker wrote
goes out when the worker is about to wait for the JVM, not after each frame.

A task's answers are flushed only when the next read finds nothing that has come: so the
answers a JVM already sent the next frame for go out together (a batch's answer with the
task's last batches, its COMMIT and its metrics) in one send, and one wake-up of the JVM's
thread, where each frame flushed alone costs a send and a wake-up of its own. Every wait
for the JVM flushes first, so the JVM never waits for something still in this buffer (the
rule that keeps the conversation free of deadlock).
"""
from __future__ import annotations

import contextlib
import io
import socket

_DONTWAIT = getattr(socket, "MSG_DONTWAIT", None)   # (Linux and macOS; else: always flush)


class _Reads(io.RawIOBase):
    """The socket's reads for a BufferedReader: what has come if anything has, else the
    pending output flushed and then a wait."""

    def __init__(self, sock: socket.socket, pending: io.BufferedWriter) -> None:
        self._sock, self._pending = sock, pending

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if _DONTWAIT is not None:
            with contextlib.suppress(BlockingIOError, InterruptedError):   # nothing has come
                return self._sock.recv_into(buffer, 0, _DONTWAIT)
        self._pending.flush()   # about to wait for the JVM: what it may wait for goes first
        return self._sock.recv_into(buffer)


class Connection:
    """read / write / flush over a connected socket (the file object protocol.py uses)."""

    def __init__(self, sock: socket.socket, buffer_bytes: int = 65536) -> None:
        self._writer = sock.makefile("wb", buffering=buffer_bytes)
        self._reader = io.BufferedReader(_Reads(sock, self._writer), buffer_bytes)
        self.read, self.write, self.flush = (self._reader.read, self._writer.write,
                                             self._writer.flush)
