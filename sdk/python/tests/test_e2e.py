"""The SDK against a real forkd daemon with real VMs (started by test/sdk/python.test.ts): Sandbox ergonomics,
streamed commands with line callbacks, errors carrying output, stdin, cancellation that kills the guest process,
timeouts per call and per sandbox, files, lifetimes, pause and resume, BRANCH, and the Controller over TCP with a token."""

import os
import tempfile
import threading
import time
import unittest
from typing import Dict, Iterator, List, Tuple, Union

import forkd
from forkd import CommandExitError, Controller, Sandbox
from helpers import daemon_env

COUNT_SLEEPERS = "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done | grep -c '^sleep 424242' || true"


class SandboxOnRealVms(unittest.TestCase):
    daemon: Dict[str, str]
    url: str
    tag: str

    @classmethod
    def setUpClass(cls) -> None:
        cls.daemon = daemon_env()
        cls.url = cls.daemon["FORKD_TEST_URL"]
        cls.tag = cls.daemon["FORKD_TEST_SNAPSHOT"]

    def create(self, **kwargs: object) -> Sandbox:
        options = {"snapshot_tag": self.tag, "url": self.url, "timeout": 300, "env": {}}
        options.update(kwargs)
        sandbox = Sandbox.create(**options)  # type: ignore[arg-type]
        self.addCleanup(sandbox.kill)
        return sandbox

    def test_with_block_streams_lines_as_they_happen_and_kills_at_the_end(self) -> None:
        seen: List[Tuple[float, str]] = []
        with Sandbox.create(snapshot_tag=self.tag, url=self.url, env={}) as sandbox:
            self.assertEqual(sandbox.info["status"], "running")
            started = time.monotonic()
            result = sandbox.commands.run(
                "echo first; sleep 1.5; echo second; printf 'no newline'",
                on_stdout=lambda line: seen.append((time.monotonic() - started, line)),
            )
            ended = time.monotonic() - started
            self.assertEqual(result.stdout, "first\nsecond\nno newline")
            self.assertEqual([line for _, line in seen], ["first\n", "second\n", "no newline"])
            self.assertLess(seen[0][0], ended - 1.0, "the first line arrived while the command still ran")
            self.assertIsNone(result.signal)
            sandbox_id = sandbox.id
        with self.assertRaises(forkd.SandboxNotFoundError):
            Sandbox.connect(sandbox_id, url=self.url, env={})
        self.assertFalse(Sandbox.kill(sandbox_id, url=self.url, env={}), "already gone")

    def test_errors_carry_the_output_and_timeouts_apply_per_call_and_per_sandbox(self) -> None:
        sandbox = self.create(command_timeout=2)
        with self.assertRaises(CommandExitError) as failed:
            sandbox.commands.run("echo partial; echo 'bad thing' >&2; exit 3")
        self.assertEqual((failed.exception.exit_code, failed.exception.stdout, failed.exception.stderr),
                         (3, "partial\n", "bad thing\n"))
        self.assertIn("exited with code 3: bad thing", str(failed.exception))
        started = time.monotonic()
        with self.assertRaises(CommandExitError) as slow:
            sandbox.commands.run("sleep 30")  # the sandbox's command_timeout: 2 s
        self.assertTrue(slow.exception.timed_out)
        self.assertEqual(slow.exception.exit_code, 137)
        self.assertLess(time.monotonic() - started, 20)
        self.assertEqual(sandbox.commands.run("sleep 3; echo done", timeout=30).stdout, "done\n")
        code = sandbox.run_code("print('side'); 6 * 7")
        self.assertEqual((code.result, code.stdout, code.error), ("42", "side\n", None))
        raised = sandbox.run_code("raise ValueError('nope')")
        self.assertIsNotNone(raised.error)
        assert raised.error is not None
        self.assertEqual((raised.error.name, raised.error.value), ("ValueError", "nope"))
        self.assertIn("Traceback", raised.error.traceback)
        looped = sandbox.run_code("while True: pass", timeout=1)
        self.assertIsNotNone(looped.error, "an evaluation past its timeout is stopped")

    def test_stdin_streams_and_cancelling_kills_the_guest_process(self) -> None:
        sandbox = self.create()

        def chunks() -> Iterator[Union[str, bytes]]:
            words: List[Union[str, bytes]] = ["one\n", b"two\n", "three"]
            for word in words:
                yield word
                time.sleep(0.2)

        self.assertEqual(sandbox.commands.run(["cat"], stdin=chunks()).stdout, "one\ntwo\nthree")
        self.assertEqual(sandbox.commands.run("wc -c", stdin=b"\x00" * 100000).stdout.strip(), "100000")

        token = forkd.CancelToken()
        threading.Timer(1.5, token.cancel, args=("enough",)).start()
        started = time.monotonic()
        with self.assertRaises(forkd.CancelledError) as cancelled:
            sandbox.commands.run("sleep 424242", cancel=token)
        self.assertEqual(cancelled.exception.reason, "enough")
        self.assertLess(time.monotonic() - started, 10)
        # Leaving a stream early kills its command too.
        with sandbox.controller.exec_stream(sandbox.id, ["sh", "-c", "echo go; exec sleep 424242"]) as events:
            first = next(iter(events))
            self.assertEqual(getattr(first, "data", b""), b"go\n")
        deadline = time.monotonic() + 15
        while sandbox.commands.run(COUNT_SLEEPERS).stdout.strip() != "0":
            self.assertLess(time.monotonic(), deadline, "the cancelled commands still run in the guest")
            time.sleep(0.3)

    def test_a_callback_that_raises_stops_the_command(self) -> None:
        sandbox = self.create()

        def stop(line: str) -> None:
            raise RuntimeError(f"stop at {line.strip()}")

        with self.assertRaisesRegex(RuntimeError, "stop at tick"):
            sandbox.commands.run("echo tick; exec sleep 424242", on_stdout=stop)
        deadline = time.monotonic() + 15
        while sandbox.commands.run(COUNT_SLEEPERS).stdout.strip() != "0":
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.3)

    def test_files(self) -> None:
        sandbox = self.create()
        data = bytes(range(256)) * 64
        self.assertEqual(sandbox.files.write("/tmp/dir/data.bin", data), {"path": "/tmp/dir/data.bin", "bytes": len(data)})
        self.assertEqual(sandbox.files.read("/tmp/dir/data.bin", format="bytes"), data)
        sandbox.files.write("/tmp/dir/run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
        self.assertEqual(sandbox.commands.run(["/tmp/dir/run.sh"]).stdout, "ran\n")
        entries = {e.name: e for e in sandbox.files.list("/tmp/dir")}
        self.assertEqual(sorted(entries), ["data.bin", "run.sh"])
        self.assertEqual((entries["run.sh"].mode, entries["data.bin"].size, entries["data.bin"].path),
                         (0o755, len(data), "/tmp/dir/data.bin"))
        self.assertEqual(sandbox.files.stat("/tmp/dir").type, "dir")
        self.assertTrue(sandbox.files.exists("/tmp/dir/run.sh"))
        with self.assertRaises(forkd.PayloadTooLargeError):
            sandbox.controller.read_file(sandbox.id, "/tmp/dir/data.bin", max_bytes=100)
        sandbox.files.remove("/tmp/dir", recursive=True)
        self.assertFalse(sandbox.files.exists("/tmp/dir/run.sh"))
        with self.assertRaises(forkd.NotFoundError) as missing:
            sandbox.files.read("/tmp/dir/data.bin")
        self.assertNotIsInstance(missing.exception, forkd.SandboxNotFoundError, "the sandbox is fine, the file is not")
        with self.assertRaises(forkd.InvalidArgumentError):
            sandbox.files.read("relative/path")

    def test_egress_policy_at_create_and_while_running(self) -> None:
        sandbox = self.create(network={"egress": "deny", "allow_out": ["PyPI.org"]})
        self.assertEqual(sandbox.info["network"]["kind"], "netns")
        self.assertEqual(sandbox.info["network"]["egress"], {"egress": "deny", "allow_out": ["pypi.org"], "deny_out": []})
        # Fields left out of an update come from the default (this snapshot's template has none: the daemon's).
        self.assertEqual(sandbox.update_network("allow", deny_out=["10.1.2.3/8"]),
                         {"egress": "allow", "allow_out": [], "deny_out": ["10.0.0.0/8"]})
        self.assertEqual(sandbox.controller.get_sandbox(sandbox.id)["network"]["egress"]["egress"], "allow")
        with self.assertRaises(forkd.InvalidArgumentError) as bad_entry:
            sandbox.update_network("deny", allow_out=["not a name"])
        self.assertIn("not a name", str(bad_entry.exception))
        self.assertEqual(sandbox.info["network"]["egress"]["egress"], "allow", "a refused update changes nothing")
        with self.assertRaises(forkd.InvalidArgumentError) as typo:
            self.create(network={"egres": "deny"})
        self.assertIn("unknown field(s) egres", str(typo.exception))
        isolated = self.create(network="none")
        self.assertEqual((isolated.info["network"]["kind"], isolated.info["network"]["egress"]),
                         ("private", {"egress": "deny", "allow_out": [], "deny_out": []}))

    def test_lifetime_ends_the_sandbox_and_set_timeout_extends_it(self) -> None:
        short = self.create(timeout=3)
        kept = self.create(timeout=3)
        kept.set_timeout(0)
        self.assertIsNone(kept.get_info()["expires_at_unix_ms"])
        time.sleep(6)
        with self.assertRaises(forkd.SandboxNotFoundError) as gone:
            short.commands.run("true")
        self.assertIn("lifetime", str(gone.exception))
        self.assertFalse(short.is_running())
        self.assertEqual(kept.commands.run("echo alive").stdout, "alive\n")

    def test_pause_then_connect_resumes_where_it_was(self) -> None:
        sandbox = self.create()
        sandbox.run_code("kept = 41 + 1")
        sandbox.files.write("/root/before-pause", "written\n")
        paused = sandbox.pause()
        self.assertEqual(paused["sandbox"]["status"], "paused")
        self.assertGreater(paused["bytes_stored"], 0)
        self.assertIn(sandbox.id, [s["id"] for s in Sandbox.list(status="paused", url=self.url, env={})])
        with self.assertRaises(forkd.ConflictError):
            sandbox.commands.run("true")
        with self.assertRaises(forkd.ConflictError):
            sandbox.pause()
        again = Sandbox.connect(sandbox.id, url=self.url, env={})
        self.assertEqual(again.id, sandbox.id)
        self.assertEqual(again.info["status"], "running")
        self.assertEqual(again.run_code("kept").result, "42")
        self.assertEqual(again.files.read("/root/before-pause"), "written\n")
        with self.assertRaises(forkd.ConflictError):
            Sandbox.resume(sandbox.id, url=self.url, env={})

    def test_workspace_suspends_and_resumes_by_name(self) -> None:
        c = Controller(self.url, env={})
        created = c.create_workspace("py-sdk-notes", self.tag)
        self.addCleanup(lambda: c.delete_workspace("py-sdk-notes") if c.list_workspaces() else None)
        sandbox_id = created["live_sandbox_id"]
        c.write_file(sandbox_id, "/root/notes", b"draft\n")
        self.assertEqual(c.suspend_workspace("py-sdk-notes", diff=True)["status"], "suspended")
        self.assertEqual([w["status"] for w in c.list_workspaces()], ["suspended"])
        resumed = c.resume_workspace("py-sdk-notes")
        self.assertEqual((resumed["status"], resumed["live_sandbox_id"]), ("running", sandbox_id))
        self.assertEqual(c.read_file(sandbox_id, "/root/notes"), b"draft\n")
        c.delete_workspace("py-sdk-notes")
        with self.assertRaises(forkd.NotFoundError):
            c.get_workspace("py-sdk-notes")

    def test_branch_then_children_continue_from_there(self) -> None:
        source = self.create()
        source.run_code("trail = ['start']")
        source.files.write("/root/progress", "halfway\n")
        branch = source.branch(mode="diff", measure_diff=True)
        # Cleanups run last-first: the children go, then the source (it depends on its branch), then the branch.
        self.addCleanup(Controller(self.url, env={}).delete_snapshot, branch["tag"])
        self.addCleanup(source.kill)
        self.assertEqual((branch["mode"], branch["branched_from"], branch["parent_tag"]),
                         ("diff", source.id, self.tag))
        self.assertIsInstance(branch["pause_ms"], int)
        self.assertGreater(branch["diff_physical_bytes"], 0)
        source.run_code("trail.append('source')")
        children = Sandbox.create_many(2, snapshot_tag=branch["tag"], url=self.url, env={}, timeout=120)
        for child in children:
            self.addCleanup(child.kill)
        for i, child in enumerate(children):
            self.assertEqual(child.run_code(f"trail.append({i}); trail").result, f"['start', {i}]")
            self.assertEqual(child.files.read("/root/progress"), "halfway\n")
        info = source.get_info()
        self.assertEqual((info["has_branched"], info["branch_count"]), (True, 1))


class ControllerOverTcp(unittest.TestCase):
    daemon: Dict[str, str]
    controller: Controller

    @classmethod
    def setUpClass(cls) -> None:
        cls.daemon = daemon_env()
        cls.controller = Controller(cls.daemon["FORKD_TEST_TCP_URL"], cls.daemon["FORKD_TEST_TOKEN"], env={})

    def test_controller_methods(self) -> None:
        c = self.controller
        tag = self.daemon["FORKD_TEST_SNAPSHOT"]
        self.assertTrue(c.is_reachable())
        self.assertEqual(c.version()["api"], "v1")
        self.assertIn(tag, [s["tag"] for s in c.list_snapshots()])
        self.assertEqual(c.get_snapshot(tag)["status"], "ready")
        detail = c.snapshot_info(tag)
        self.assertEqual((detail["chain_depth"], detail["ancestors"]), (0, []))
        [sandbox] = c.spawn_sandboxes(tag, lifetime=120)
        sandbox_id = sandbox["id"]
        try:
            self.assertIsNotNone(sandbox["expires_at_unix_ms"])
            ran = c.exec_command(sandbox_id, ["sh", "-c", "echo $GREETING from $(pwd); cat"], env={"GREETING": "hi"},
                                 cwd="/tmp", stdin="piped")
            self.assertEqual((ran["stdout"], ran["exit_code"]), ("hi from /tmp\npiped", 0))
            raw = c.exec_command(sandbox_id, ["printf", "\\377"], encoding="base64")
            self.assertEqual(raw["stdout"], "/w==")
            self.assertEqual(c.eval_code(sandbox_id, "numpy.ones(3).sum()")["result"], "3.0")
            self.assertIs(c.ping_sandbox(sandbox_id)["pong"], True)
            info = c.get_sandbox(sandbox_id)
            self.assertEqual((info["has_branched"], info["branch_count"], info["last_branch_memory_path"]),
                             (False, 0, None))
            self.assertIsNone(c.set_sandbox_timeout(sandbox_id, 0)["expires_at_unix_ms"])
            self.assertEqual([s["id"] for s in c.list_sandboxes(tag)], [sandbox_id])
            self.assertEqual(c.list_files(sandbox_id, "/")["path"], "/")
        finally:
            self.assertEqual(c.kill_sandboxes(snapshot_tag=tag), [sandbox_id])
        with self.assertRaises(forkd.NotFoundError):
            c.kill_sandbox(sandbox_id)
        with self.assertRaises(forkd.NotFoundError) as unknown:
            c.get_sandbox("sb-abc-0000")
        self.assertEqual(unknown.exception.body, {"error": "sandbox sb-abc-0000 not found", "code": "not_found"})
        with self.assertRaises(forkd.InvalidArgumentError):
            c.spawn_sandboxes(tag, n=0)
        with self.assertRaises(forkd.NotImplementedError):
            c.spawn_sandboxes(tag, prewarm=True)

    def test_pack_and_unpack(self) -> None:
        c = self.controller
        tag = self.daemon["FORKD_TEST_SNAPSHOT"]
        with tempfile.TemporaryDirectory() as work:
            out = os.path.join(work, "snapshot.tar.zst")
            packed = c.pack_snapshot(tag, out, without_image=True)
            self.assertEqual((packed["chain"], packed["bytes"]), ([tag], os.path.getsize(out)))
            with self.assertRaises(forkd.InvalidArgumentError):
                c.pack_snapshot(tag, out)  # an existing file is never overwritten
            with self.assertRaises(forkd.NotFoundError):
                c.pack_snapshot("no-such-tag", os.path.join(work, "x"))
            self.assertFalse(os.path.exists(os.path.join(work, "x")), "a failed download leaves no file")
            installed = c.unpack_snapshot(out, tag="py-moved")
            self.assertEqual((installed["head"], installed["installed"]), ("py-moved", ["py-moved"]))
            [sandbox] = c.spawn_sandboxes("py-moved", lifetime=120)
            try:
                self.assertEqual(c.eval_code(sandbox["id"], "int(numpy.ones(5).sum())")["result"], "5")
            finally:
                c.kill_sandbox(sandbox["id"])
            c.delete_snapshot("py-moved")
            bogus = os.path.join(work, "bogus.tar.zst")
            with open(bogus, "wb") as f:
                f.write(b"not a pack" * 1000)
            with self.assertRaises(forkd.InvalidArgumentError):
                c.unpack_snapshot(bogus, tag="never")
            self.assertNotIn("never", [s["tag"] for s in c.list_snapshots()])

    def test_tokens(self) -> None:
        url = self.daemon["FORKD_TEST_TCP_URL"]
        with self.assertRaisesRegex(forkd.AuthenticationError, "no token was sent"):
            Controller(url, env={}).list_snapshots()
        with self.assertRaisesRegex(forkd.AuthenticationError, "token from FORKD_TOKEN was refused"):
            Controller(url, env={"FORKD_TOKEN": "not-the-token-0123456789"}).list_snapshots()
        self.assertTrue(Controller(env={"FORKD_URL": url, "FORKD_TOKEN": self.daemon["FORKD_TEST_TOKEN"]}).list_snapshots())


if __name__ == "__main__":
    unittest.main()
