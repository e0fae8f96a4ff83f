/**
 * The unmodified `e2b` SDKs' Template.build (JS from npm; Python from PyPI, test/e2b/python/test_template_build.py
 * in the venv of test/support/python-venv.ts) against a real forkd daemon and a real registry (Debian's
 * docker-registry on loopback): a busybox image pushed there is the base; a template with every step kind the
 * SDK sends (ENV, WORKDIR, COPY of uploaded files, RUN as root and as another user, USER) and a start command
 * with a ready command is built, and a sandbox created from it by name answers with the start command's server
 * running and the steps' results in place; the same template built again reuses every cached step; a failing
 * step fails the build naming the step and its output; a Dockerfile (parsed by the SDK) builds the same way. The
 * Python SDK does the same against the same daemon and registry (its own template names).
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { promisify } from "node:util";
import { BuildError, type LogEntry, Sandbox, Template } from "e2b";
import { makeBusyboxLayout } from "../image/oci-fixtures.js";
import { startDaemon, type TestDaemon } from "../sdk/daemon-fixture.js";
import { e2bPythonVenv, PYTHON_TESTS_DIR } from "../support/python-venv.js";
import { freePort, Registry } from "../support/registry.js";

const execFileAsync = promisify(execFile);
/**
 * `npm test` runs the essential cases (a build with every instruction whose sandbox runs its start command, a
 * failing step); the cached rebuild, the Dockerfile and the Python SDK (each another build VM under TCG, several
 * minutes in all) run with `npm run test:templates`, which sets this.
 */
const FULL_ONLY = process.env.FORKD_TEMPLATE_TESTS === "all" ? false : "runs with npm run test:templates";
/**
 * The SDKs run commands as `/bin/bash -l -c` (E2B's templates all have bash); the busybox test image has only
 * sh, so the templates give it a bash that is sh (no backslashes: the SDK's Dockerfile parser drops them).
 */
const BASH_SHIM = `echo '#!/bin/sh' > /bin/bash && echo 'exec /bin/sh "$@"' >> /bin/bash && chmod 755 /bin/bash`;
const isRoot = process.geteuid?.() === 0;

describe("E2B Template.build (JS SDK) on a real daemon", {
  skip: !isRoot && "needs root",
  timeout: 30 * 60_000,
}, () => {
  let daemon: TestDaemon;
  let registry: Registry;
  let dir: string;
  let image: string;
  const saved = { ...process.env };
  const sandboxes: Sandbox[] = [];

  before(async () => {
    dir = await fs.mkdtemp(path.join(os.tmpdir(), "forkd-e2b-template-"));
    registry = new Registry(dir, await freePort());
    await registry.start();
    const layout = await makeBusyboxLayout(path.join(dir, "busybox"));
    image = `127.0.0.1:${registry.port}/e2b-test/busybox:1`;
    await execFileAsync("skopeo", [
      "copy",
      "--quiet",
      "--dest-tls-verify=false",
      `oci:${layout}:latest`,
      `docker://${image}`,
    ]);
    // The build context: a directory and a file the COPY steps upload.
    await fs.mkdir(path.join(dir, "context", "site", "docs"), { recursive: true });
    await fs.writeFile(path.join(dir, "context", "site", "index.html"), "hello from a template build\n");
    await fs.writeFile(path.join(dir, "context", "site", "docs", "a.txt"), "nested\n");
    await fs.writeFile(path.join(dir, "context", "config.ini"), "[app]\nmode=test\n");
    daemon = await startDaemon();
    process.env.E2B_API_URL = daemon.tcpUrl;
    process.env.E2B_SANDBOX_URL = daemon.tcpUrl;
    process.env.E2B_API_KEY = daemon.token;
  });

  after(async () => {
    process.env = saved;
    for (const s of sandboxes) await s.kill().catch(() => {});
    if (daemon) {
      const log = daemon.log();
      await daemon.stop().catch((err: unknown) => {
        throw new Error(`${(err as Error).message}\ndaemon log:\n${log.slice(-4000)}`);
      });
    }
    await registry?.stop();
    await fs.rm(dir, { recursive: true, force: true });
  });

  const appTemplate = () =>
    Template({ fileContextPath: path.join(dir, "context") })
      .fromImage(image)
      .setEnvs({ APP_MODE: "production", GREETING: "from-env" })
      .setWorkdir("/srv")
      .runCmd(BASH_SHIM)
      .copy("site", "site/")
      .copy("config.ini", "/etc/app/", { user: "user", mode: 0o640 })
      .runCmd('echo "built in $(pwd) as $(id -un)" > /srv/built.txt')
      .runCmd("id -un > /home/user/ran-as", { user: "user" })
      .setUser("user")
      .runCmd('mkdir -p /home/user/data && echo "$APP_MODE" > /home/user/data/mode')
      .setStartCmd("httpd -f -p 8000 -h /srv/site", "wget -q -O /dev/null http://127.0.0.1:8000/index.html");

  let firstBuild: { templateId: string; buildId: string } | undefined;

  it("builds every step kind into a template whose sandboxes run its start command", async () => {
    const logs: LogEntry[] = [];
    const info = await Template.build(appTemplate(), "e2b-app:v1", {
      onBuildLogs: (l) => logs.push(l),
      cpuCount: 1,
      memoryMB: 256,
    });
    firstBuild = info;
    assert.equal(info.name, "e2b-app:v1");
    const text = logs.map((l) => l.message).join("\n");
    assert.match(text, /Uploaded 'site'/);
    assert.match(text, /Uploaded 'config.ini'/);
    assert.match(text, /step \d+\/\d+: copy files\/\d+\/site -> \/srv\/site/, text.slice(-3000));
    assert.match(text, /Build finished/);
    assert.equal(await Template.exists("e2b-app"), true);

    const sbx = await Sandbox.create("e2b-app", { timeoutMs: 10 * 60_000 });
    sandboxes.push(sbx);
    // The start command's server is running in the sandbox: it serves the uploaded files.
    const page = await sbx.commands.run("wget -q -O - http://127.0.0.1:8000/index.html");
    assert.equal(page.stdout, "hello from a template build\n");
    const nested = await sbx.commands.run(
      "cat /srv/site/docs/a.txt /srv/built.txt /home/user/ran-as /home/user/data/mode",
    );
    assert.equal(nested.stdout, "nested\nbuilt in /srv as root\nuser\nproduction\n");
    const config = await sbx.commands.run("ls -l /etc/app/config.ini && cat /etc/app/config.ini", {
      user: "root",
    });
    assert.match(config.stdout, /^-rw-r----- +1 user +user .*\n\[app\]\nmode=test\n$/);
    const env = await sbx.commands.run('echo "$GREETING $(pwd)"');
    assert.equal(env.stdout, "from-env /srv\n", "ENV and WORKDIR are every process's defaults");
    const tags = await Template.getTags("e2b-app");
    assert.deepEqual(
      tags.map((t) => t.tag),
      ["v1"],
    );
    assert.equal(tags[0]?.buildId, info.buildId);
  });

  it("pause({keepMemory: false}) then connect(): the cold boot runs the start command again; one that fails leaves it paused", async () => {
    assert.ok(firstBuild, "needs the template the first case built");
    const sbx = await Sandbox.create("e2b-app", { timeoutMs: 10 * 60_000 });
    sandboxes.push(sbx);
    const id = sbx.sandboxId;
    const page = "wget -q -O - http://127.0.0.1:8000/index.html";
    assert.equal((await sbx.commands.run(page)).stdout, "hello from a template build\n");
    // A process of its own, so the test knows the resume was a boot (a warm restore would keep it).
    const sleeper = await sbx.commands.run("sleep 3600", { background: true });
    assert.equal(await sbx.pause({ keepMemory: false }), true);
    const resumed = await Sandbox.connect(id, { timeoutMs: 10 * 60_000 });
    const pids = (await resumed.commands.list()).map((p) => p.pid);
    assert.ok(
      !pids.includes(sleeper.pid),
      `booted afresh: the process from before is gone (${pids.join(",")})`,
    );
    // The template's start command (httpd, as `user` in /srv) runs again, and ready passed before connect answered.
    assert.equal((await resumed.commands.run(page)).stdout, "hello from a template build\n");
    const server = await resumed.commands.run("ps -o user,args | grep '[h]ttpd -f -p 8000'");
    assert.match(server.stdout, /^\s*user\s+httpd -f -p 8000 -h \/srv\/site\s*$/m, server.stdout);

    // Without a `sync` in the guest a filesystem-only pause is refused saying why, and the sandbox runs on.
    await resumed.commands.run("rm /bin/sync", { user: "root" });
    await assert.rejects(resumed.pause({ keepMemory: false }), (err: Error) => {
      assert.match(err.message, /a filesystem-only pause needs a `sync` program in the image/);
      return true;
    });
    assert.equal((await Sandbox.getInfo(id)).state, "running");
    await resumed.commands.run("busybox ln -s busybox /bin/sync", { user: "root" });

    // Its start command cannot start any more (httpd exits without its directory): the resume fails saying so,
    // and the sandbox stays paused on its kept disk.
    await resumed.commands.run("rm -rf /srv/site", { user: "root" });
    assert.equal(await resumed.pause({ keepMemory: false }), true);
    const kept = path.join(daemon.home, "kept-disks", id, "disk.qcow2");
    const keptBefore = await fs.stat(kept);
    await assert.rejects(Sandbox.connect(id, { timeoutMs: 10 * 60_000 }), (err: Error) => {
      assert.match(err.message, /start command exited \(exit code \d+\) before ready succeeded/);
      assert.match(err.message, /stays paused on its kept disk/);
      return true;
    });
    assert.equal((await Sandbox.getInfo(id)).state, "paused");
    const keptAfter = await fs.stat(kept);
    assert.equal(keptAfter.ino, keptBefore.ino, "the same kept disk");
    assert.ok(keptAfter.isFile() && keptAfter.size > 0);
    assert.equal(await Sandbox.kill(id), true);
    await assert.rejects(fs.stat(path.dirname(kept)), "a kill removes the kept disk");
  });

  it("a rebuild of the same template reuses every cached step", { skip: FULL_ONLY }, async () => {
    const logs: LogEntry[] = [];
    const info = await Template.build(appTemplate(), "e2b-app:v2", {
      onBuildLogs: (l) => logs.push(l),
      memoryMB: 256,
    });
    assert.equal(info.templateId, firstBuild?.templateId, "the same template, a new build");
    assert.notEqual(info.buildId, firstBuild?.buildId);
    const text = logs.map((l) => l.message).join("\n");
    assert.match(text, /Skipping upload of 'site', already cached/);
    const stepLines = text
      .split("\n")
      .filter((l) => /^(base|step \d+\/\d+): .* \((cached|[\d.]+ s)\)$/.test(l));
    assert.ok(stepLines.length >= 10, text.slice(-3000));
    for (const line of stepLines) assert.match(line, /\(cached\)$/, `every step cached: ${line}`);
    const tags = (await Template.getTags("e2b-app")).map((t) => t.tag).sort();
    assert.deepEqual(tags, ["v1", "v2"]);
    await Template.removeTags("e2b-app", "v1");
    assert.deepEqual(
      (await Template.getTags("e2b-app")).map((t) => t.tag),
      ["v2"],
    );
  });

  it("a failing step fails the build, naming the step and ending with its output", async () => {
    const failing = Template()
      .fromImage(image)
      .runCmd("echo fine")
      .runCmd("echo line-before-failure; echo oops >&2; exit 3");
    await assert.rejects(Template.build(failing, "e2b-failing"), (err: unknown) => {
      assert.ok(err instanceof BuildError, String(err));
      assert.match(err.message, /step \d+\/\d+: run echo line-before-failure.*failed \(exit status 3\)/s);
      assert.match(err.message, /line-before-failure/);
      assert.match(err.message, /oops/);
      return true;
    });
  });

  it("a Dockerfile, parsed by the SDK, builds the same way", { skip: FULL_ONLY }, async () => {
    const dockerfile = `FROM ${image}\nRUN ${BASH_SHIM}\nENV FROM_DOCKERFILE=yes\nWORKDIR /work\nRUN echo "df $FROM_DOCKERFILE" > /work/out.txt\nUSER user\n`;
    const info = await Template.build(Template().fromDockerfile(dockerfile), "e2b-dockerfile");
    const status = await Template.getBuildStatus(info);
    assert.equal(status.status, "ready");
    const sbx = await Sandbox.create("e2b-dockerfile", { timeoutMs: 5 * 60_000 });
    sandboxes.push(sbx);
    const out = await sbx.commands.run("cat /work/out.txt && id -un && pwd");
    assert.equal(out.stdout, "df yes\nuser\n/work\n");
  });

  it("the Python SDK's Template.build: every instruction, a cached rebuild, a failing step, a Dockerfile", {
    skip: FULL_ONLY,
  }, async () => {
    const venv = await e2bPythonVenv();
    const args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "test_template_build.py"];
    const result = await execFileAsync(venv.python, args, {
      cwd: PYTHON_TESTS_DIR,
      env: {
        PATH: process.env.PATH ?? "",
        HOME: process.env.HOME ?? "/root",
        PYTHONDONTWRITEBYTECODE: "1",
        E2B_API_URL: daemon.tcpUrl,
        E2B_SANDBOX_URL: daemon.tcpUrl,
        E2B_API_KEY: daemon.token,
        FORKD_TEST_IMAGE: image,
        FORKD_TEST_CONTEXT: path.join(dir, "context"),
        FORKD_TEST_BASH_SHIM: BASH_SHIM,
      },
      maxBuffer: 16 * 1024 * 1024,
      timeout: 20 * 60_000,
    }).catch((err: { stdout?: string; stderr?: string; message: string }) => {
      throw new Error(`pytest failed:\n${err.stdout ?? ""}\n${err.stderr ?? ""}\n${err.message}`);
    });
    assert.match(result.stdout, /\b4 passed\b/, result.stdout);
    process.stdout.write(`# python: e2b ${venv.versions.e2b}\n`);
  });
});
