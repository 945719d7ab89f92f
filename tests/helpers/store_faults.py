"""Faults on the object store, injected between Hadoop's S3A connector and the S3 server: an
HTTP proxy on loopback that S3A is given as the bucket's endpoint, passing every request
through to the server unless a rule the test armed says otherwise. The fault kinds are
those of Spark's FailureInjectionFileSystem (a write that fails mid-upload) and of
hadoop-aws's FailureInjectionPolicy (throttling of a share of requests, a limit on how many
fail), met as a real client meets them: on the wire.

    proxy = FaultProxy(store.port).start()
    proxy.reset_uploads(r"/state/.*\\.delta", times=2)   # the next 2 uploads: reset mid-body
    proxy.throttle(r"/state/", every=3)                  # every 3rd request: 503 SlowDown
    proxy.clear(); proxy.injected                        # {"reset": 2, "throttle": 7}

Written with the standard library (http.server and http.client, a thread per client
connection) rather than a proxy library: the faults must be decided per request by method
and object key and cut a request mid-body, which TCP-level fault proxies (Toxiproxy) cannot
tell apart, and an intercepting proxy (mitmproxy) would bring a large dependency and buffer
bodies unless told otherwise. What passes through is relayed as it comes: headers
untouched (S3A signs them, the Host header included), bodies streamed in both directions
whatever their framing (length, chunked), connections kept alive.
"""
from __future__ import annotations

import collections
import contextlib
import http.client
import http.server
import re
import socket
import struct
import threading
import urllib.parse
import uuid
from dataclasses import dataclass

CHUNK = 64 * 1024
SLOW_DOWN = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>"
             "<Message>Please reduce your request rate.</Message><Resource>{resource}"
             "</Resource><RequestId>{request}</RequestId></Error>")


@dataclass
class Rule:
    """A fault for the requests whose method is one of `methods` (all when empty) and whose
    path (`/bucket/key`, decoded) matches `pattern`: on every `every`-th of them, `times`
    times (None: until cleared)."""
    kind: str              # "reset" (mid-body, an upload) or "throttle" (503 SlowDown)
    pattern: re.Pattern
    methods: frozenset
    times: int | None
    every: int = 1
    uploads_only: bool = False   # only requests that carry a body (not a copy's PUT)
    seen: int = 0

    def fires(self, method: str, path: str, has_body: bool) -> bool:
        if self.times == 0 or (self.methods and method not in self.methods) \
                or (self.uploads_only and not has_body) or not self.pattern.search(path):
            return False
        self.seen += 1
        if self.seen % self.every:
            return False
        if self.times is not None:
            self.times -= 1
        return True


class FaultProxy:
    """The proxy: `endpoint` is what S3A is given; faults are armed with `reset_uploads`
    and `throttle`, dropped with `clear`; `injected` counts those injected by kind."""

    def __init__(self, upstream_port: int, host: str = "127.0.0.1"):
        self.upstream = (host, upstream_port)
        self._rules: list[Rule] = []
        self._lock = threading.Lock()
        self.injected: collections.Counter = collections.Counter()
        self.faults: list[tuple[str, str, str]] = []   # (kind, method, path) of each
        self.passed = 0   # requests relayed to the server
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "FaultProxy":
        proxy = self

        class Handler(_Relay):
            owner = proxy

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="store-fault-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops serving and closes the connections it holds."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            held, self._connections = list(self._connections), set()
        for conn in held:
            _reset(conn)
        self._thread.join(timeout=10)
        self._server = None

    # -- rules --

    def reset_uploads(self, pattern: str, times: int | None = 1, every: int = 1,
                      methods=("PUT", "POST")) -> None:
        """The matching uploads (requests with a body) have their connection reset after
        half their body has been read, before the server sees them."""
        self._arm(Rule("reset", re.compile(pattern), frozenset(methods), times, every,
                       uploads_only=True))

    def throttle(self, pattern: str, times: int | None = None, every: int = 1,
                 methods=()) -> None:
        """The matching requests are answered 503 SlowDown, as S3 throttles (S3's XML error
        body), their body read first so the connection stays usable."""
        self._arm(Rule("throttle", re.compile(pattern), frozenset(methods), times, every))

    def clear(self) -> None:
        """Drops the rules (the counts stay: `forget` drops them)."""
        with self._lock:
            self._rules.clear()

    def forget(self) -> None:
        with self._lock:
            self.injected.clear()
            self.faults.clear()

    def _arm(self, rule: Rule) -> None:
        with self._lock:
            self._rules.append(rule)

    def _fault_for(self, method: str, path: str, has_body: bool) -> str | None:
        with self._lock:
            for rule in self._rules:
                if rule.fires(method, path, has_body):
                    self.injected[rule.kind] += 1
                    self.faults.append((rule.kind, method, path))
                    return rule.kind
            self.passed += 1
            return None

    def _held(self, conn: socket.socket, held: bool) -> None:
        with self._lock:
            (self._connections.add if held else self._connections.discard)(conn)


def _reset(conn: socket.socket) -> None:
    """Closes a socket with a TCP reset (no orderly FIN), as a dropped connection is seen."""
    with contextlib.suppress(OSError):   # the client may have gone already
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()


class _Relay(http.server.BaseHTTPRequestHandler):
    """One client connection: each request relayed to the server over a connection of its
    own kept for the client's, or a fault."""

    protocol_version = "HTTP/1.1"
    owner: FaultProxy

    def setup(self) -> None:
        super().setup()
        self.owner._held(self.connection, True)
        self._upstream: http.client.HTTPConnection | None = None

    def finish(self) -> None:
        with contextlib.suppress(OSError, ValueError):   # the connection was reset on purpose
            super().finish()
        self.owner._held(self.connection, False)
        if self._upstream is not None:
            self._upstream.close()

    def log_message(self, format, *args) -> None:   # noqa: A002 - the base class's name
        """Nothing logged per request: the tests read the proxy's counts of what it did."""

    def __getattr__(self, name: str):
        if name.startswith("do_"):   # every method, as BaseHTTPRequestHandler looks them up
            return self._relay
        raise AttributeError(name)

    # -- the request --

    def _has_body(self) -> bool:
        return (int(self.headers.get("Content-Length") or 0) > 0
                or "chunked" in self.headers.get("Transfer-Encoding", "").lower())

    def _body(self, limit: int | None = None):
        """The request body as it came on the wire (chunked framing kept), in pieces; with
        `limit`, no more than that many bytes."""
        left = limit if limit is not None else float("inf")
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            while left > 0:
                line = self.rfile.readline(1024)
                yield line
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:   # the trailer, to its empty line
                    while True:
                        line = self.rfile.readline(8192)
                        yield line
                        if line in (b"\r\n", b"\n", b""):
                            return
                data = self.rfile.read(min(size + 2, left))
                left -= len(data)
                yield data
            return
        remaining = int(self.headers.get("Content-Length") or 0)
        while remaining > 0 and left > 0:
            data = self.rfile.read(int(min(CHUNK, remaining, left)))
            if not data:
                return
            remaining -= len(data)
            left -= len(data)
            yield data

    def _drain(self, limit: int | None = None) -> None:
        """Reads the request body (or its first `limit` bytes) and drops it."""
        collections.deque(self._body(limit), maxlen=0)

    def _relay(self) -> None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        fault = self.owner._fault_for(self.command, path, self._has_body())
        if fault == "reset":
            length = int(self.headers.get("Content-Length") or 0)
            self._drain(limit=max(1, length // 2) if length else 1)
            self.close_connection = True
            _reset(self.connection)
            return
        if fault == "throttle":
            self._drain()
            self._slow_down(path)
            return
        try:
            answer = self._forward()
        except (OSError, http.client.HTTPException):
            # the server is down or dropped the connection: the client sees it dropped too
            self.close_connection = True
            _reset(self.connection)
            return
        self._answer(answer)

    def _forward(self) -> http.client.HTTPResponse:
        if self._upstream is None:
            self._upstream = http.client.HTTPConnection(*self.owner.upstream, timeout=120)
        up = self._upstream
        try:
            up.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                up.putheader(name, value)
            up.endheaders()
            for piece in self._body():
                up.send(piece)
            return up.getresponse()
        except (OSError, http.client.HTTPException):
            up.close()
            self._upstream = None
            raise

    def _answer(self, answer: http.client.HTTPResponse) -> None:
        self.send_response_only(answer.status, answer.reason)
        for name, value in answer.getheaders():
            self.send_header(name, value)
        self.end_headers()
        if answer.will_close:
            self.close_connection = True
        no_body = self.command == "HEAD" or answer.status in (204, 304) or answer.status < 200
        if not no_body:
            chunked = answer.chunked
            while True:
                data = answer.read1(CHUNK) if chunked else answer.read(CHUNK)
                if not data:
                    break
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
            if chunked:
                self.wfile.write(b"0\r\n\r\n")
        answer.close()
        self.wfile.flush()
        if answer.will_close:
            self._upstream.close()
            self._upstream = None

    def _slow_down(self, path: str) -> None:
        body = SLOW_DOWN.format(resource=path, request=uuid.uuid4().hex[:16].upper()).encode()
        self.send_response_only(503, "Slow Down")
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("x-amz-request-id", "ARROWSTATE-FAULT")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.wfile.flush()
