"""http: one call with urllib, and waiting for an endpoint."""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from stocksvr_harness import http, procs
from stocksvr_harness.wait import WaitTimeout


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        code = 200 if self.path == "/healthz" else 404
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b"ok" if code == 200 else b"no such path")

    def do_POST(self):
        body = self.rfile.read(int(self.headers["content-length"]))
        self.send_response(201)
        self.end_headers()
        self.wfile.write(json.dumps({"got": json.loads(body), "type": self.headers["content-type"]}).encode())

    def do_DELETE(self):
        self.send_response(204)
        self.end_headers()


@pytest.fixture(scope="module")
def server():
    s = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=s.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{s.server_address[1]}"
    s.shutdown()


def test_an_error_status_is_an_answer(server):
    assert http.call("GET", server + "/healthz") == (200, "ok")
    assert http.call("GET", server + "/nope") == (404, "no such path")


def test_a_dict_goes_as_json(server):
    status, body = http.call_json("POST", server + "/x", {"a": 1})
    assert status == 201
    assert body == {"got": {"a": 1}, "type": "application/json"}
    assert http.call_json("DELETE", server + "/x") == (204, None)


def test_a_refused_connection_raises_oserror():
    with pytest.raises(OSError):
        http.call("GET", "http://127.0.0.1:9/", timeout=2)
    assert not http.answers("http://127.0.0.1:9/")


def test_wait_http_returns_once_it_answers(server):
    assert http.wait_http(server + "/healthz", 5, "the test server")


def test_wait_http_times_out_with_the_url(server):
    with pytest.raises(WaitTimeout, match=r"the test server to answer 200 at .*/nope"):
        http.wait_http(server + "/nope", 0.5, "the test server", interval=0.1)


def test_wait_http_stops_at_once_when_the_process_exited(tmp_path):
    child = procs.Child([sys.executable, "-c", "print('stocksvr: bind failed')"], str(tmp_path / "r.log")).start()
    child.proc.wait()
    with pytest.raises(procs.Exited, match="stocksvr: bind failed"):
        http.wait_http("http://127.0.0.1:9/healthz", 30, "role", child=child)
