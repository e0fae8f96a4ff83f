"""Test support: the daemon the end-to-end tests use (from the environment the npm test sets up), and a small
real HTTP server that stands in for the daemon where a test needs to control its answers exactly."""

from __future__ import annotations

import json
import os
import shutil
import socket
import socketserver
import tempfile
import threading
import unittest
from http.server import BaseHTTPRequestHandler
from typing import Any, Callable, Dict, List, Optional, Tuple

import forkd


def daemon_env() -> Dict[str, str]:
    """FORKD_TEST_URL (Unix socket), FORKD_TEST_TCP_URL, FORKD_TEST_TOKEN, FORKD_TEST_SNAPSHOT; set by
    test/sdk/python.test.ts, which starts a real daemon with real VMs."""
    names = ["FORKD_TEST_URL", "FORKD_TEST_TCP_URL", "FORKD_TEST_TOKEN", "FORKD_TEST_SNAPSHOT"]
    missing = [n for n in names if not os.environ.get(n)]
    if missing:
        raise unittest.SkipTest(f"no test daemon ({', '.join(missing)} unset): run through `npm test`")
    return {n: os.environ[n] for n in names}


Handler = Callable[["Recorded"], Tuple[int, Dict[str, str], bytes]]


class Recorded:
    """One request the stand-in server received."""

    def __init__(self, method: str, path: str, headers: Dict[str, str], body: bytes) -> None:
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


class StubDaemon:
    """TEST DOUBLE of the daemon's HTTP surface (a real HTTP/1.1 server on a real socket): answers each request
    with ``handler`` and records it. Says nothing about real sandboxes; test_e2e.py uses the real daemon."""

    def __init__(self, handler: Handler, *, unix: bool = False) -> None:
        self.requests: List[Recorded] = []
        stub = self

        class RequestHandler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if self.headers.get("Transfer-Encoding") == "chunked":
                    body = _read_chunked(self.rfile)
                else:
                    body = self.rfile.read(length)
                recorded = Recorded(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                stub.requests.append(recorded)
                status, headers, payload = handler(recorded)
                if status == 0:  # drop the connection without answering
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_DELETE = _serve

        if unix:
            self._dir = tempfile.mkdtemp(prefix="forkd-py-stub-")
            self.socket_path = os.path.join(self._dir, "stub.sock")

            class UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
                daemon_threads = True
                block_on_close = False

                def handle_error(self, request: Any, client_address: Any) -> None:
                    pass  # a client that went away (deadline and cancellation tests) is expected

                def get_request(self) -> Any:
                    conn, _ = self.socket.accept()
                    return conn, ("local", 0)

            self.server: socketserver.BaseServer = UnixServer(self.socket_path, RequestHandler)
            self.url = f"unix:{self.socket_path}"
        else:

            class TcpServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
                daemon_threads = True
                block_on_close = False
                allow_reuse_address = True

                def handle_error(self, request: Any, client_address: Any) -> None:
                    pass

            self.server = TcpServer(("127.0.0.1", 0), RequestHandler)
            self.url = f"http://127.0.0.1:{self.server.server_address[1]}"  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def controller(self, **kwargs: Any) -> forkd.Controller:
        return forkd.Controller(self.url, env={}, **kwargs)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        # The unix stub's directory and socket (one was left in /tmp per run).
        if getattr(self, "_dir", None):
            shutil.rmtree(self._dir, ignore_errors=True)


def json_answer(status: int, value: Any, headers: Optional[Dict[str, str]] = None) -> Tuple[int, Dict[str, str], bytes]:
    return status, {"Content-Type": "application/json", **(headers or {})}, json.dumps(value).encode()


def _read_chunked(stream: Any) -> bytes:
    out = b""
    while True:
        size = int(stream.readline().strip(), 16)
        if size == 0:
            stream.readline()
            return out
        out += stream.read(size)
        stream.readline()
