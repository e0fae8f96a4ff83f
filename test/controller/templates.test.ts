/**
 * Templates from images on real VMs: an OCI archive made in the test (a busybox image: no libc, no Python)
 * and a Dockerfile built by buildah become snapshots whose children answer, see the image's environment,
 * working directory and files, and have the template's `start` service running the moment they exist.
 */
import assert from "node:assert/strict";
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { createSnapshot } from "../../src/controller/create-snapshot.js";
import { forkChildren } from "../../src/controller/fork.js";
import { makeBusyboxLayout, saveArchive } from "../image/oci-fixtures.js";
import { qemusMentioning, tempHome } from "../support/host.js";

const isRoot = process.geteuid?.() === 0;

const SERVICE_TEMPLATE = `format = 2
name = "oci-service"
memory_mib = 256
disk_mib = 256
[from]
archive = "image.tar"
[[steps]]
env = { APP_MODE = "prod" }
[[steps]]
workdir = "/srv"
[[steps]]
copy = "app"
dest = "/srv/app"
[[steps]]
run = "echo built-$APP_MODE-$GREETING > built.txt"
[start]
# lo is down in a guest without a NIC: the service brings it up for itself.
command = "ip link set lo up && exec httpd -f -p 127.0.0.1:8080 -h /srv/app"
[ready]
command = '''printf 'GET /hello.txt HTTP/1.0\\r\\n\\r\\n' | nc -w 2 127.0.0.1 8080 | grep -q '200 OK' '''
timeout_s = 120
interval_ms = 100
`;

const DOCKERFILE = (archive: string) => `FROM oci-archive:${archive}
ARG FLAVOUR=plain
ENV DF_MODE=dockerfile
WORKDIR /work
COPY copied.txt /work/copied.txt
RUN echo "ran-with-$FLAVOUR-$GREETING" > /work/ran.txt && mkdir -p /work/sub
`;

describe("templates from images on real VMs", { skip: !isRoot && "needs root", timeout: 30 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let dir: string;

  before(async () => {
    home = await tempHome("forkd-templates-");
    dir = await fs.mkdtemp(path.join(os.tmpdir(), "forkd-templates-src-"));
    const layout = await makeBusyboxLayout(path.join(dir, "img"));
    const t = path.join(dir, "t");
    await fs.mkdir(path.join(t, "app"), { recursive: true });
    await saveArchive(layout, "oci-archive", path.join(t, "image.tar"));
    await fs.writeFile(path.join(t, "app", "hello.txt"), "hello from the app\n");
    await fs.writeFile(path.join(t, "service.toml"), SERVICE_TEMPLATE);
    await fs.mkdir(path.join(t, "df"));
    await fs.writeFile(path.join(t, "df", "Dockerfile"), DOCKERFILE(path.join(t, "image.tar")));
    await fs.writeFile(path.join(t, "df", "copied.txt"), "copied by COPY\n");
    await fs.writeFile(
      path.join(t, "df", "template.toml"),
      'format = 2\nname = "dockerfile-demo"\nmemory_mib = 256\ndisk_mib = 256\n[dockerfile]\nargs = { FLAVOUR = "spicy" }\n',
    );
  });

  after(async () => {
    assert.deepEqual(await qemusMentioning(home.home), [], "no QEMU left running");
    await home.cleanup();
    await fs.rm(dir, { recursive: true, force: true });
  });

  it("an OCI archive made in the test becomes a template whose children answer, its service already up", async () => {
    const created = await createSnapshot(home, {
      tag: "oci-service",
      template: path.join(dir, "t", "service.toml"),
    });
    assert.equal(created.manifest.template.interpreter, "none");
    const started = performance.now();
    const result = await forkChildren(home, {
      tag: "oci-service",
      n: 2,
      exec: [
        "sh",
        "-c",
        "echo mode=$APP_MODE; pwd; cat built.txt; printf 'GET /hello.txt HTTP/1.0\\r\\n\\r\\n' | nc -w 5 127.0.0.1 8080; ps",
      ],
    });
    const seconds = (performance.now() - started) / 1000;
    for (const child of result.children) {
      assert.equal(child.error, null, `child ${child.index}: ${child.error}`);
      assert.equal(child.exit_code, 0, child.stderr);
      assert.match(child.stdout, /^mode=prod$/m, "the image's env (an env step) is every process's");
      assert.match(child.stdout, /^\/srv$/m, "the image's working directory is the default");
      assert.match(
        child.stdout,
        /^built-prod-hello$/m,
        "a run step's output, with the OCI config's GREETING",
      );
      assert.match(child.stdout, /200 OK/, "the start service answers at once, in every child");
      assert.match(child.stdout, /hello from the app/);
      assert.match(
        child.stdout,
        /httpd -f -p 127\.0\.0\.1:8080/,
        "the service is the parent's, still running",
      );
    }
    assert.ok(seconds < 120, `children answered in ${seconds.toFixed(1)} s`);
    const evaluated = await forkChildren(home, { tag: "oci-service", n: 1, eval: "1+1" });
    assert.match(
      evaluated.children[0]?.error ?? "",
      /no interpreter/,
      "no Python eval in an image without one",
    );
  });

  it("a Dockerfile with RUN/COPY/ENV/WORKDIR builds with buildah and its effects are visible in children", async () => {
    await createSnapshot(home, {
      tag: "dockerfile-demo",
      template: path.join(dir, "t", "df", "template.toml"),
    });
    const result = await forkChildren(home, {
      tag: "dockerfile-demo",
      n: 2,
      exec: ["sh", "-c", "echo mode=$DF_MODE; pwd; cat copied.txt ran.txt; test -d sub && echo has-sub"],
    });
    for (const child of result.children) {
      assert.equal(child.error, null, `child ${child.index}: ${child.error}`);
      assert.equal(child.exit_code, 0, child.stderr);
      assert.match(child.stdout, /^mode=dockerfile$/m, "ENV");
      assert.match(child.stdout, /^\/work$/m, "WORKDIR");
      assert.match(child.stdout, /^copied by COPY$/m, "COPY");
      assert.match(
        child.stdout,
        /^ran-with-spicy-hello$/m,
        "RUN, with the build argument and the base's env",
      );
      assert.match(child.stdout, /^has-sub$/m);
    }
  });
});
