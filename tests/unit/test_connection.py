"""The worker's socket: what it writes goes out when it is about to wait for the JVM, and
not while what it reads has already come."""
import socket
import threading

from arrowstate.connection import Connection


def _pending(peer: socket.socket) -> bytes:
    """What has reached the JVM's end so far (nothing waited for)."""
    peer.setblocking(False)
    try:
        return peer.recv(1 << 16)
    except BlockingIOError:
        return b""
    finally:
        peer.settimeout(5)   # a wait that never ends fails the test instead


def test_writes_go_out_before_a_read_that_would_wait_and_not_before_one_that_would_not():
    ours, jvm = socket.socketpair()
    try:
        conn = Connection(ours)
        jvm.settimeout(5)
        jvm.sendall(b"ab")   # the JVM's next frame has come already
        conn.write(b"answer")
        assert conn.read(1) == b"a"
        assert _pending(jvm) == b""   # a read that does not wait sends nothing
        assert conn.read(1) == b"b"
        assert _pending(jvm) == b""
        conn.write(b"-more")
        got = []
        reader = threading.Thread(target=lambda: got.append(conn.read(2)))
        reader.start()   # nothing has come: the read flushes, then waits
        answer = b""
        while len(answer) < len(b"answer-more"):
            answer += jvm.recv(64)
        assert answer == b"answer-more"
        jvm.sendall(b"cd")
        reader.join(5)
        assert got == [b"cd"]
    finally:
        ours.close()
        jvm.close()


def test_a_closed_connection_reads_short():
    ours, jvm = socket.socketpair()
    conn = Connection(ours)
    jvm.sendall(b"x")
    jvm.close()
    try:
        assert conn.read(4) == b"x"   # protocol.read_exact makes this an EOFError
    finally:
        ours.close()
