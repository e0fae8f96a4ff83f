"""HTTP behaviour against a stand-in daemon (helpers.StubDaemon, a real HTTP server on a real Unix socket or TCP
port): the exact v0.5 request bodies, error classes by status, deadlines, cancellation, unreachable daemons and
dropped connections, NDJSON exec streams."""

import base64
import json
import os
import socket
import tempfile
import threading
import time
import unittest
from typing import Dict, Tuple, Type

import forkd
from helpers import Recorded, StubDaemon, json_answer


class V05RequestShapes(unittest.TestCase):
    """What goes on the wire is what forkd v0.5's Python SDK sent, so a v0.5 daemon or proxy sees the same."""

    def setUp(self) -> None:
        self.stub = StubDaemon(self.answer, unix=True)
        self.addCleanup(self.stub.close)
        self.controller = self.stub.controller()

    def answer(self, request: Recorded):
        if request.method == "DELETE" and request.path.startswith("/v1/sandboxes?"):
            return json_answer(200, {"killed": []})
        if request.method == "DELETE":
            return 204, {}, b""
        if request.path == "/v1/sandboxes" and request.method == "POST":
            return json_answer(201, [{"id": "sb-0123456789ab"}])
        return json_answer(200, {"ok": True})

    def test_bodies(self) -> None:
        c = self.controller
        c.spawn_sandboxes("pyagent", n=2)
        c.spawn_sandboxes("pyagent", memory_limit_mib=256, live_fork=True)
        c.branch_sandbox("sb-1", tag="checkpoint-1")
        c.branch_sandbox("sb-1", diff=True, measure_diff=True)
        c.branch_sandbox("sb-1", mode="live", wait=False)
        c.exec_command("sb-1", ["python3", "-c", "print(2+2)"])
        c.eval_code("sb-1", "1+1")
        c.ping_sandbox("sb-1")
        c.kill_sandbox("sb-1")
        c.delete_snapshot("old")
        sent = [(r.method, r.path, r.json() if r.body else None) for r in self.stub.requests]
        self.assertEqual(sent, [
            ("POST", "/v1/sandboxes", {"snapshot_tag": "pyagent", "n": 2, "per_child_netns": False}),
            ("POST", "/v1/sandboxes", {"snapshot_tag": "pyagent", "n": 1, "per_child_netns": False,
                                       "memory_limit_mib": 256, "live_fork": True}),
            ("POST", "/v1/sandboxes/sb-1/branch", {"tag": "checkpoint-1"}),
            ("POST", "/v1/sandboxes/sb-1/branch", {"diff": True, "measure_diff": True}),
            ("POST", "/v1/sandboxes/sb-1/branch", {"mode": "live", "wait": False}),
            ("POST", "/v1/sandboxes/sb-1/exec", {"args": ["python3", "-c", "print(2+2)"], "timeout_secs": 30}),
            ("POST", "/v1/sandboxes/sb-1/eval", {"code": "1+1"}),
            ("POST", "/v1/sandboxes/sb-1/ping", None),
            ("DELETE", "/v1/sandboxes/sb-1", None),
            ("DELETE", "/v1/snapshots/old", None),
        ])
        self.assertEqual(self.stub.requests[0].headers["content-type"], "application/json")
        self.assertNotIn("authorization", self.stub.requests[0].headers)

    def test_beyond_v05(self) -> None:
        c = self.controller
        c.spawn_sandboxes("t", lifetime=0)
        c.exec_command("sb-1", ["true"], timeout_secs=1.5, env={"A": "b"}, cwd="/tmp", stdin=b"\x00\xff")
        c.exec_command("sb-1", ["true"], timeout_secs=0)
        c.eval_code("sb-1", "x", timeout_secs=2)
        c.delete_snapshot("a/b", cascade=True)
        c.kill_sandboxes(all=True)
        bodies = [r.json() if r.body else None for r in self.stub.requests]
        self.assertEqual(bodies[0]["timeout_ms"], 0)
        self.assertEqual(bodies[1], {"args": ["true"], "timeout_ms": 1500, "env": {"A": "b"}, "cwd": "/tmp",
                                     "stdin_b64": base64.b64encode(b"\x00\xff").decode()})
        self.assertEqual(bodies[2]["timeout_secs"], 86400, "no limit is sent as the daemon's maximum")
        self.assertEqual(bodies[3], {"code": "x", "timeout_ms": 2000})
        # A value never adds a path segment.
        self.assertEqual(self.stub.requests[4].path, "/v1/snapshots/a%2Fb?cascade=true")
        self.assertEqual(self.stub.requests[5].path, "/v1/sandboxes?all=true")

    def test_files_are_bytes_on_the_wire(self) -> None:
        self.controller.write_file("sb-1", "/tmp/a b.bin", b"\x00\x01", mode=0o755)
        request = self.stub.requests[-1]
        self.assertEqual((request.method, request.path), ("PUT", "/v1/sandboxes/sb-1/files?path=%2Ftmp%2Fa+b.bin&mode=755"))
        self.assertEqual((request.body, request.headers["content-type"]), (b"\x00\x01", "application/octet-stream"))


class ErrorClasses(unittest.TestCase):
    def test_status_families(self) -> None:
        cases: Dict[int, Type[forkd.ForkdError]] = {
            400: forkd.InvalidArgumentError, 401: forkd.AuthenticationError, 404: forkd.NotFoundError,
            409: forkd.ConflictError, 413: forkd.PayloadTooLargeError, 429: forkd.RateLimitError,
            500: forkd.ServerError, 501: forkd.NotImplementedError, 503: forkd.UnavailableError,
            504: forkd.TimeoutError,
        }
        for status, cls in cases.items():
            def answer(request: Recorded, s: int = status) -> Tuple[int, Dict[str, str], bytes]:
                return json_answer(s, {"error": f"nope {s}", "code": "x"}, {"Retry-After": "3"})

            stub = StubDaemon(answer)
            try:
                with self.assertRaises(cls) as caught:
                    stub.controller().get_sandbox("sb-1")
                err = caught.exception
                self.assertEqual((err.status, err.code, err.server_message), (status, "x", f"nope {status}"))
                self.assertEqual(err.body, {"error": f"nope {status}", "code": "x"}, "v0.5's ControllerError.body")
                self.assertIn(f"(HTTP {status} from GET /v1/sandboxes/sb-1)", str(err))
                if isinstance(err, (forkd.RateLimitError, forkd.UnavailableError)):
                    self.assertEqual(err.retry_after, 3.0)
            finally:
                stub.close()

    def test_token_hints(self) -> None:
        stub = StubDaemon(lambda r: json_answer(401, {"error": "invalid bearer token", "code": "unauthorized"}))
        self.addCleanup(stub.close)
        with self.assertRaisesRegex(forkd.AuthenticationError, "no token was sent: set FORKD_TOKEN"):
            stub.controller().list_snapshots()
        with self.assertRaisesRegex(forkd.AuthenticationError, "token from the `token` argument was refused"):
            stub.controller(token="wrong-token-0123456789").list_snapshots()
        self.assertEqual(stub.requests[-1].headers["authorization"], "Bearer wrong-token-0123456789")


class Reachability(unittest.TestCase):
    def test_no_socket_says_what_to_do(self) -> None:
        missing = os.path.join(tempfile.mkdtemp(), "none.sock")
        with self.assertRaises(forkd.ConnectionError) as caught:
            forkd.Controller(f"unix:{missing}", env={}).list_snapshots()
        err = caught.exception
        self.assertEqual((err.daemon_reachable, err.errno_name), (False, "ENOENT"))
        self.assertRegex(str(err), "no forkd daemon socket at .* is `forkd daemon` running")
        self.assertFalse(forkd.Controller(f"unix:{missing}", env={}).is_reachable())

    def test_refused_tcp(self) -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        with self.assertRaisesRegex(forkd.ConnectionError, "nothing listens at http://127.0.0.1"):
            forkd.Controller(f"http://127.0.0.1:{port}", env={}).list_snapshots()

    def test_dropped_connection_with_the_daemon_up(self) -> None:
        stub = StubDaemon(lambda r: (200, {}, b"ok") if r.path == "/healthz" else (0, {}, b""))
        self.addCleanup(stub.close)
        with self.assertRaises(forkd.ConnectionError) as caught:
            stub.controller().list_sandboxes()
        self.assertIs(caught.exception.daemon_reachable, True)
        self.assertRegex(str(caught.exception), "dropped during GET /v1/sandboxes.*still up")


class DeadlinesAndCancellation(unittest.TestCase):
    def setUp(self) -> None:
        self.release = threading.Event()
        self.addCleanup(self.release.set)

        def slow(request: Recorded):
            self.release.wait(10)
            return json_answer(200, [])

        self.stub = StubDaemon(slow)
        self.addCleanup(self.stub.close)

    def test_request_timeout_names_the_setting(self) -> None:
        started = time.monotonic()
        with self.assertRaises(forkd.TimeoutError) as caught:
            self.stub.controller(timeout=0.3).list_snapshots()
        self.assertLess(time.monotonic() - started, 3)
        self.assertEqual(caught.exception.setting, "request_timeout")
        self.assertIn("pass a larger `request_timeout`", str(caught.exception))
        with self.assertRaises(forkd.TimeoutError):
            self.stub.controller().list_snapshots(request_timeout=0.2)

    def test_cancel_from_another_thread(self) -> None:
        token = forkd.CancelToken()
        threading.Timer(0.3, token.cancel, args=("user pressed stop",)).start()
        started = time.monotonic()
        with self.assertRaises(forkd.CancelledError) as caught:
            self.stub.controller().list_snapshots(cancel=token)
        self.assertLess(time.monotonic() - started, 3)
        self.assertEqual(caught.exception.reason, "user pressed stop")
        with self.assertRaises(forkd.CancelledError):
            self.stub.controller().list_snapshots(cancel=token)  # a cancelled token fails at once


class ExecStreams(unittest.TestCase):
    def stream_of(self, lines):
        payload = "".join(json.dumps(line) + "\n" for line in lines).encode()
        stub = StubDaemon(lambda r: (200, {"Content-Type": "application/x-ndjson"}, payload))
        self.addCleanup(stub.close)
        return stub

    def test_events_and_exit(self) -> None:
        b64 = lambda data: base64.b64encode(data).decode()  # noqa: E731
        stub = self.stream_of([
            {"type": "started", "id": "sb-1"},
            {"type": "stdout", "data": b64(b"\xc3")},
            {"type": "stdout", "data": b64(b"\xa9\n")},
            {"type": "stderr", "data": b64(b"warn\n")},
            {"type": "future-kind", "x": 1},
            {"type": "exit", "exit_code": 3, "signal": None, "timed_out": False, "duration_ms": 5.5},
        ])
        with stub.controller().exec_stream("sb-1", ["x"], timeout_secs=5) as events:
            got = list(events)
        self.assertEqual([(e.type, getattr(e, "data", None)) for e in got],
                         [("stdout", b"\xc3"), ("stdout", b"\xa9\n"), ("stderr", b"warn\n"), ("exit", None)])
        self.assertEqual(got[-1].exit_code, 3)  # type: ignore[union-attr]
        sent = stub.requests[0].json()
        self.assertEqual((sent["encoding"], sent["timeout_secs"], stub.requests[0].headers["accept"]),
                         ("base64", 5, "application/x-ndjson"))

    def test_error_line_raises_its_class(self) -> None:
        stub = self.stream_of([{"type": "error", "error": "sandbox sb-1 was killed", "code": "conflict"}])
        with self.assertRaisesRegex(forkd.ConflictError, "was killed"):
            list(stub.controller().exec_stream("sb-1", ["x"]))

    def test_stream_without_exit_is_a_dropped_connection(self) -> None:
        stub = self.stream_of([{"type": "stdout", "data": ""}])
        with self.assertRaisesRegex(forkd.ConnectionError, "ended before its exit"):
            list(stub.controller().exec_stream("sb-1", ["x"]))


if __name__ == "__main__":
    unittest.main()
