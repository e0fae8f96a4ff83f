"""The core `e2b` SDK through e2b-code-interpreter's Sandbox, sync and async: what the JS suite
(test/e2b/sdk-e2e.test.ts) covers, method by method."""

import asyncio
import datetime
import os
import time
import urllib.request

import pytest
from e2b import (
    AuthenticationException,
    CommandExitException,
    NotFoundException,
    PtySize,
    SandboxQuery,
    SandboxException,
    TimeoutException,
)
from conftest import LIFETIME_S, RUN, SUITE, aw
from e2b_code_interpreter import Sandbox

pytestmark = pytest.mark.anyio


async def wait_for(what, seconds, probe):
    """Polls `probe` until it is true. Sleeps with asyncio: the async API's callbacks (on_event, on_data) run as
    tasks of this event loop, which a blocking sleep would starve."""
    deadline = time.monotonic() + seconds
    while True:
        value = await aw(probe())
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


async def test_commands(sbx, api):
    who = await aw(sbx.commands.run("whoami; pwd; echo $HOME; echo $GREETING"))
    assert who.stdout == "user\n/home/user\n/home/user\nfrom-create\n"
    assert (await aw(sbx.commands.run("whoami", user="root"))).stdout == "root\n"

    with pytest.raises(CommandExitException) as failure:
        await aw(sbx.commands.run("echo out; echo err >&2; exit 3"))
    assert failure.value.exit_code == 3
    assert failure.value.stdout == "out\n"
    assert failure.value.stderr == "err\n"

    chunks = []
    streamed = await aw(
        sbx.commands.run(
            "for i in 1 2 3; do echo tick $i; sleep 0.2; done",
            on_stdout=chunks.append,
            cwd="/tmp",
            envs={"EXTRA": "x"},
        )
    )
    assert streamed.stdout == "tick 1\ntick 2\ntick 3\n"
    assert "".join(chunks) == streamed.stdout

    sleeper = await aw(sbx.commands.run("sleep 600", background=True))
    assert sleeper.pid > 0
    listed = await aw(sbx.commands.list())
    entry = next(p for p in listed if p.pid == sleeper.pid)
    assert entry.args == ["-l", "-c", "sleep 600"]
    assert await aw(sbx.commands.kill(sleeper.pid)) is True

    async def gone():
        return not any(p.pid == sleeper.pid for p in await aw(sbx.commands.list()))

    await wait_for("the killed process to leave the list", 30, gone)
    assert await aw(sbx.commands.kill(sleeper.pid)) is False

    cat = await aw(sbx.commands.run("cat", background=True, stdin=True))
    await aw(sbx.commands.send_stdin(cat.pid, "typed in\n"))
    await aw(sbx.commands.close_stdin(cat.pid))
    assert (await aw(cat.wait())).stdout == "typed in\n"

    ticker = await aw(sbx.commands.run("sleep 1; echo later", background=True))
    await aw(ticker.disconnect())
    again = await aw(sbx.commands.connect(ticker.pid))
    assert (await aw(again.wait())).stdout.strip() == "later"

    with pytest.raises(TimeoutException):
        await aw(sbx.commands.run("sleep 30", timeout=1.5))


async def test_files(sbx, api):
    blob = bytes(range(256)) + os.urandom(2 << 20)
    await aw(sbx.files.write(f"{api}/data/blob.bin", blob))
    assert await aw(sbx.files.read(f"{api}/data/blob.bin", format="bytes")) == blob

    written = await aw(
        sbx.files.write_files(
            [
                {"path": f"/home/user/{api}/many/a.txt", "data": "A"},
                {"path": f"{api}/many/sub/c.txt", "data": "C"},
            ]
        )
    )
    assert sorted(w.path for w in written) == [
        f"/home/user/{api}/many/a.txt",
        f"/home/user/{api}/many/sub/c.txt",
    ]
    listing = await aw(sbx.files.list(f"/home/user/{api}/many"))
    assert sorted(f"{e.name}:{e.type.value}" for e in listing) == ["a.txt:file", "sub:dir"]
    assert next(e for e in listing if e.name == "a.txt").owner == "user"
    deep = await aw(sbx.files.list(f"{api}/many", depth=2))
    assert any(e.path == f"/home/user/{api}/many/sub/c.txt" for e in deep)

    assert await aw(sbx.files.exists(f"{api}/many/a.txt")) is True
    assert await aw(sbx.files.exists(f"{api}/many/nope.txt")) is False
    info = await aw(sbx.files.get_info(f"{api}/many/a.txt"))
    assert info.size == 1
    assert info.permissions == "-rw-r--r--"
    moved = await aw(sbx.files.rename(f"{api}/many/a.txt", f"{api}/many/renamed.txt"))
    assert moved.path == f"/home/user/{api}/many/renamed.txt"
    assert await aw(sbx.files.read(f"{api}/many/renamed.txt")) == "A"
    await aw(sbx.files.remove(f"{api}/many/renamed.txt"))
    assert await aw(sbx.files.exists(f"{api}/many/renamed.txt")) is False
    assert await aw(sbx.files.make_dir(f"{api}/made/deep")) is True
    assert await aw(sbx.files.make_dir(f"{api}/made/deep")) is False
    with pytest.raises(NotFoundException):
        await aw(sbx.files.read("no/such/file"))
    hostname = await aw(sbx.files.read("../../../../proc/sys/kernel/hostname"))
    assert hostname.strip() == sbx.sandbox_id

    # Over the daemon's upload limit (the harness starts it with 8 MiB): refused, nothing left behind.
    with pytest.raises(SandboxException, match="413"):
        await aw(sbx.files.write(f"{api}/big/huge.bin", os.urandom(9 << 20)))
    assert (await aw(sbx.commands.run(f"ls -A /home/user/{api}/big 2>/dev/null || true"))).stdout == ""


async def test_writes_in_place_watch_events_name_the_file(sbx, api):
    """E2B's envd writes files in place: a watcher sees the user's file, not temporary names."""
    directory = f"{api}/watched"
    await aw(sbx.files.make_dir(f"{directory}/inner"))
    events = []
    nested = []
    if api == "sync":
        flat = sbx.files.watch_dir(directory)
        deep = sbx.files.watch_dir(directory, recursive=True)
    else:
        flat = await sbx.files.watch_dir(directory, on_event=events.append)
        deep = await sbx.files.watch_dir(directory, on_event=nested.append, recursive=True)
    await aw(sbx.files.write(f"{directory}/top.txt", "t"))
    await aw(sbx.files.write(f"{directory}/inner/nested.txt", "n"))

    def poll():
        if api == "sync":
            events.extend(flat.get_new_events())
            nested.extend(deep.get_new_events())
        return any(e.name == "top.txt" for e in events) and any(e.name == "inner/nested.txt" for e in nested)

    await wait_for("watch events", 30, poll)
    await asyncio.sleep(0.5)
    poll()
    assert {e.name for e in events} == {"top.txt"}, "only the written file, never a temporary name"
    assert {e.name for e in nested} <= {"top.txt", "inner/nested.txt"}
    await aw(flat.stop())
    await aw(deep.stop())


async def test_pty(sbx, api):
    output = bytearray()
    if api == "sync":
        import threading

        terminal = sbx.pty.create(PtySize(rows=24, cols=80), timeout=0)

        def pump():
            for _stdout, _stderr, pty in terminal:
                if pty:
                    output.extend(pty)

        threading.Thread(target=pump, daemon=True).start()
    else:
        terminal = await sbx.pty.create(PtySize(rows=24, cols=80), on_data=output.extend, timeout=0)
    await aw(sbx.pty.send_stdin(terminal.pid, b"echo pty-$((6*7)); stty size\n"))
    await wait_for("the shell's answer", 30, lambda: b"pty-42" in output and b"24 80" in output)
    await aw(sbx.pty.resize(terminal.pid, PtySize(rows=30, cols=100)))
    await aw(sbx.pty.send_stdin(terminal.pid, b"stty size\n"))
    await wait_for("the new size", 30, lambda: b"30 100" in output)
    assert await aw(sbx.pty.kill(terminal.pid)) is True


async def test_info_list_timeout_metrics_connect(sbx, cls, api):
    info = await aw(sbx.get_info())
    assert info.sandbox_id == sbx.sandbox_id
    assert info.template_id == "shared-pyagent"
    assert info.metadata["suite"] == SUITE
    assert info.state.value == "running"

    paginator = cls.list(query=SandboxQuery(metadata={"run": RUN, "api": api}))
    found = await aw(paginator.next_items())
    assert [s.sandbox_id for s in found] == [sbx.sandbox_id]
    none = await aw(cls.list(query=SandboxQuery(metadata={"run": "other"})).next_items())
    assert none == []

    before = info.end_at
    await aw(sbx.set_timeout(1900))
    assert (await aw(sbx.get_info())).end_at > before

    # A series since the sandbox started (a sample every 5 s), memory and disk from the guest.
    async def two_samples():
        return len(await aw(sbx.get_metrics())) >= 2

    await wait_for("a second metrics sample", 30, two_samples)
    metrics = await aw(sbx.get_metrics())
    assert [m.timestamp for m in metrics] == sorted(m.timestamp for m in metrics)
    assert metrics[0].timestamp >= info.started_at - datetime.timedelta(seconds=10)
    latest = metrics[-1]
    assert latest.mem_total > 100 * 1024 * 1024 and 0 < latest.mem_used < latest.mem_total
    assert latest.disk_total > 100 * 1024 * 1024 and 0 < latest.disk_used < latest.disk_total
    recent = await aw(sbx.get_metrics(start=latest.timestamp))
    assert 1 <= len(recent) < len(metrics), "start narrows the series"

    connected = await aw(cls.connect(sbx.sandbox_id))
    assert (await aw(connected.commands.run("echo connected"))).stdout == "connected\n"
    assert await aw(connected.is_running()) is True


async def test_get_host_is_the_daemons_own_and_reaches_the_sandbox(sbx, api):
    port = 8080 if api == "sync" else 8081
    host = sbx.get_host(port)
    assert host.startswith(f"{port}-{sbx.sandbox_id}.")
    assert "e2b.app" not in host and "e2b.dev" not in host, host
    listener = os.environ["E2B_API_URL"].split("://", 1)[1]
    assert host == f"{port}-{sbx.sandbox_id}.localhost:{listener.split(':')[1]}"
    if os.environ.get("FORKD_TEST_NETWORKS") != "1":
        return
    await aw(sbx.commands.run(f"cd /tmp && python3 -m http.server {port} --bind 0.0.0.0", background=True))

    def fetched():
        # Sent to the daemon's listener with getHost's name as Host, as a client resolving *.localhost does.
        request = urllib.request.Request(f"http://{listener}/", headers={"Host": host})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status == 200 and b"Directory listing" in response.read()
        except OSError:
            return False

    await wait_for("the guest's HTTP server through getHost's name", 60, fetched)


async def test_signed_urls_through_the_sandbox_url(sbx, api):
    """download_url/upload_url built on E2B_SANDBOX_URL carry no sandbox id: the signature finds it."""
    await aw(sbx.files.write(f"{api}/signed.txt", "signed content"))
    url = sbx.download_url(f"/home/user/{api}/signed.txt", use_signature_expiration=120)
    assert url.startswith(os.environ["E2B_SANDBOX_URL"])
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.read() == b"signed content"
    upload = sbx.upload_url(f"/home/user/{api}/uploaded.txt")
    boundary = "forkdboundary"
    body = (
        f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"uploaded.txt\"\r\n"
        f"Content-Type: application/octet-stream\r\n\r\nfrom a signed url\r\n--{boundary}--\r\n"
    ).encode()
    request = urllib.request.Request(
        upload, data=body, method="POST", headers={"Content-Type": f"multipart/form-data; boundary={boundary}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
    assert await aw(sbx.files.read(f"{api}/uploaded.txt")) == "from a signed url"
    forged = url.replace("signature=v1_", "signature=v1_x")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(forged, timeout=30)
    assert refused.value.code == 401


async def test_fork_snapshot(sbx, cls, api):
    await aw(sbx.files.write(f"{api}/fork-me.txt", "before the fork"))
    await aw(sbx.run_code("marker = [1, 2, 3]"))
    forks = await aw(sbx.fork(count=1, timeout=600))
    assert len(forks) == 1
    child = forks[0]
    assert not isinstance(child, Exception), child
    try:
        assert child.sandbox_id != sbx.sandbox_id
        assert (await aw(child.run_code("marker"))).text == "[1, 2, 3]"
        assert await aw(child.files.read(f"{api}/fork-me.txt")) == "before the fork"
        assert (await aw(child.commands.run("echo $GREETING"))).stdout == "from-create\n"
        await aw(child.run_code("marker.append(4)"))
        assert (await aw(sbx.run_code("marker"))).text == "[1, 2, 3]", "the source keeps its own state"
    finally:
        await aw(child.kill())

    name = f"py-snapshot-{api}"
    snapshot = await aw(sbx.create_snapshot(name=name))
    assert snapshot.snapshot_id == name
    listed = await aw(cls.list_snapshots().next_items())
    assert any(s.snapshot_id == name for s in listed)
    assert await aw(cls.delete_snapshot(name)) is True
    assert await aw(cls.delete_snapshot(name)) is False


async def test_wrong_key_and_unknown_sandbox(cls):
    with pytest.raises(AuthenticationException):
        await aw(cls.list(api_key="e2b_0000000000000000000000000000000000000000").next_items())
    with pytest.raises(NotFoundException):
        await aw(cls.connect("sb-00000000dead"))
    assert await aw(cls.kill("sb-00000000dead")) is False


async def test_pause_and_connect_resume(sbx, cls, api):
    """pause() keeps memory, processes and files; connect() resumes it under the same id."""
    await aw(sbx.run_code("kept = 'from before the pause'"))
    await aw(sbx.files.write(f"{api}/paused.txt", "on disk"))
    assert await aw(sbx.pause()) is True
    assert (await aw(cls.get_info(sbx.sandbox_id))).state.value == "paused"
    assert await aw(cls.pause(sbx.sandbox_id)) is False, "already paused"
    resumed = await aw(cls.connect(sbx.sandbox_id, timeout=LIFETIME_S))
    assert resumed.sandbox_id == sbx.sandbox_id
    assert (await aw(resumed.run_code("kept"))).text == "from before the pause"
    assert await aw(resumed.files.read(f"{api}/paused.txt")) == "on disk"
    assert (await aw(cls.get_info(sbx.sandbox_id))).state.value == "running"
    # Paused with memory, it cannot be resumed by a cold boot (on_resume="reboot"): refused by name (501).
    assert await aw(resumed.pause()) is True
    with pytest.raises(SandboxException, match="not supported"):
        await aw(cls.connect(sbx.sandbox_id, timeout=LIFETIME_S, on_resume="reboot"))
    assert (await aw(cls.get_info(sbx.sandbox_id))).state.value == "paused"
    resumed = await aw(cls.connect(sbx.sandbox_id, timeout=LIFETIME_S))
    assert (await aw(resumed.run_code("kept"))).text == "from before the pause"


async def test_filesystem_pause_resumes_by_a_cold_boot():
    """pause(mode="filesystem") keeps the disk, id and tokens but not the processes; connect() cold-boots it.
    Sync API only: one cold boot is what this costs under TCG."""
    sandbox = Sandbox.create(
        envs={"GREETING": "from-create"}, metadata={"suite": SUITE, "run": RUN, "api": "fs-pause"}, timeout=600
    )
    sandbox_id = sandbox.sandbox_id
    try:
        sandbox.files.write("/home/user/fs-pause.txt", "written before the pause")
        sleeper = sandbox.commands.run("sleep 3600", background=True)
        assert sandbox.pause(mode="filesystem") is True
        assert Sandbox.get_info(sandbox_id).state.value == "paused"
        assert Sandbox.pause(sandbox_id, mode="filesystem") is False, "already paused"
        resumed = Sandbox.connect(sandbox_id, timeout=600)
        assert resumed.sandbox_id == sandbox_id
        assert Sandbox.get_info(sandbox_id).state.value == "running"
        assert resumed.files.read("/home/user/fs-pause.txt") == "written before the pause"
        assert sleeper.pid not in [p.pid for p in resumed.commands.list()], "the old process is gone"
        assert resumed.commands.run("echo $GREETING").stdout == "from-create\n"
        # Its memory is no snapshot's now: a pause with memory is refused by name (501); it keeps running.
        with pytest.raises(SandboxException, match="memory: false"):
            resumed.pause()
        assert resumed.is_running() is True
    finally:
        Sandbox.kill(sandbox_id)
    # The end of a lifetime with on_timeout mode "filesystem" pauses it so (autoPauseMemory false on the wire).
    timed = Sandbox.create(
        timeout=4,
        lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}},
        metadata={"suite": SUITE, "run": RUN, "api": "fs-autopause"},
    )
    try:
        deadline = time.monotonic() + 120
        while Sandbox.get_info(timed.sandbox_id).state.value != "paused":
            assert time.monotonic() < deadline, "the lifetime's end did not pause it"
            time.sleep(0.5)
        # Paused without memory: asking to restore its memory is E2B's 400 (a memory pause would resume).
        request = urllib.request.Request(
            f"{os.environ['E2B_API_URL']}/sandboxes/{timed.sandbox_id}/resume",
            data=b'{"memory": true}',
            method="POST",
            headers={"X-API-KEY": os.environ["E2B_API_KEY"], "Content-Type": "application/json"},
        )
        # E2B's "paused" includes a pause still in progress (409 then): asked again until it has finished.
        while True:
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=60)
            if refused.value.code != 409 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert refused.value.code == 400
        assert "paused with memory: false" in refused.value.read().decode()
    finally:
        assert Sandbox.kill(timed.sandbox_id) is True
