"""The object-store fault proxy (tests/helpers/store_faults.py) in front of a small server of
the standard library's: what it does not fault it passes through as sent (headers, bodies
both ways whatever their framing, ranges, HEAD, kept-alive connections); what it faults, it
faults as armed, and counts."""
import http.client
import http.server
import threading

import pytest

from store_faults import FaultProxy


class _Echo(http.server.BaseHTTPRequestHandler):
    """Answers with what it received: method, path, the headers the test looks at and the
    body; GET answers chunked (a body of unknown length), other methods with a length."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        """Nothing logged per request: the test reads what it answered."""

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        while "chunked" in self.headers.get("Transfer-Encoding", ""):
            size = int(self.rfile.readline().strip(), 16)
            if size == 0:
                self.rfile.readline()   # the trailer's end
                break
            body += self.rfile.read(size + 2)[:size]
        text = (f"{self.command} {self.path} range={self.headers.get('Range')} "
                f"sig={self.headers.get('Authorization')} ").encode() + body
        self.send_response(206 if self.headers.get("Range") else 200)
        if self.command == "GET":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(text), 7):
                piece = text[i:i + 7]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(text)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _answer


@pytest.fixture
def proxy():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proxy = FaultProxy(server.server_address[1]).start()
    yield proxy
    proxy.stop()
    server.shutdown()
    server.server_close()


def request(conn, method, path, body=None, headers=None):
    conn.request(method, path, body=body, headers=headers or {})
    answer = conn.getresponse()
    return answer.status, answer.read()


def test_what_is_not_faulted_passes_through_on_one_connection(proxy):
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    body = bytes(range(256)) * 1000
    status, echoed = request(conn, "PUT", "/b/k%20x", body, {"Authorization": "AWS4 sig"})
    assert status == 200 and echoed == b"PUT /b/k%20x range=None sig=AWS4 sig " + body
    assert request(conn, "GET", "/b/k", headers={"Range": "bytes=5-9"}) == (
        206, b"GET /b/k range=bytes=5-9 sig=None ")
    assert request(conn, "HEAD", "/b/k") == (200, b"")
    chunks = iter([b"abc", b"defg"])
    conn.request("POST", "/b/k?uploads", body=chunks, encode_chunked=True)
    answer = conn.getresponse()
    assert answer.read() == b"POST /b/k?uploads range=None sig=None abcdefg"
    assert request(conn, "DELETE", "/b/k") == (200, b"DELETE /b/k range=None sig=None ")
    assert proxy.passed == 5 and not proxy.injected
    conn.close()


def test_uploads_reset_mid_body_then_pass(proxy):
    proxy.reset_uploads(r"/state/.*\.delta", times=2)
    for _ in range(2):
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        with pytest.raises((ConnectionResetError, http.client.RemoteDisconnected,
                            BrokenPipeError)):
            request(conn, "PUT", "/b/state/0/1.delta", b"x" * 200_000)
        conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    assert request(conn, "PUT", "/b/state/0/1.snapshot", b"y")[0] == 200   # no match
    assert request(conn, "PUT", "/b/state/0/1.delta", b"x")[0] == 200      # used up
    assert request(conn, "GET", "/b/state/0/1.delta")[0] == 200            # no body
    assert proxy.injected == {"reset": 2}
    assert [f[:2] for f in proxy.faults] == [("reset", "PUT")] * 2


def test_throttling_answers_slow_down_to_every_nth_match_until_cleared(proxy):
    proxy.throttle(r"^/b/", every=2, methods=("GET", "PUT"))
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    answers = [request(conn, "PUT", f"/b/{i}", b"z" * 10) for i in range(4)]
    assert [status for status, _ in answers] == [200, 503, 200, 503]
    assert b"<Code>SlowDown</Code>" in answers[1][1] and b"<Resource>/b/1</Resource>" \
        in answers[1][1]
    assert request(conn, "DELETE", "/b/0")[0] == 200   # not a method the rule names
    proxy.clear()
    assert [request(conn, "GET", f"/b/{i}")[0] for i in range(2)] == [200, 200]
    assert proxy.injected == {"throttle": 2}
