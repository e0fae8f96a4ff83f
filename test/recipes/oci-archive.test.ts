/**
 * The oci-archive recipe on real VMs: an OCI archive made in the test (a busybox image: no libc, no Python)
 * becomes a template whose children answer, with the image's settings, the build steps' results and the
 * template's `start` service (busybox httpd, polled by `ready`) running the moment they exist.
 */
import assert from "node:assert/strict";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { forkChildren } from "../../src/controller/sandboxes/fork-children.js";
import { createSnapshot } from "../../src/controller/snapshots/create.js";
import { makeBusyboxLayout, saveArchive } from "../image/oci-fixtures.js";
import { qemusMentioning, tempHome } from "../support/host.js";
import { copyRecipe } from "./recipe-copy.js";

const isRoot = process.geteuid?.() === 0;

describe("recipe oci-archive", { skip: !isRoot && "needs root", timeout: 20 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let recipe: Awaited<ReturnType<typeof copyRecipe>>;

  before(async () => {
    home = await tempHome("forkd-recipe-oci-");
    recipe = await copyRecipe("oci-archive");
    const layout = await makeBusyboxLayout(path.join(recipe.dir, "..", "img"));
    await saveArchive(layout, "oci-archive", path.join(recipe.dir, "image.tar"));
  });

  after(async () => {
    assert.deepEqual(await qemusMentioning(home.home), [], "no QEMU left running");
    await home.cleanup();
    await recipe.cleanup();
  });

  it("an OCI archive made in the test becomes a template whose children answer, its service already up", async () => {
    const created = await createSnapshot(home, {
      tag: "oci-archive",
      template: recipe.template,
      templateFiles: true,
    });
    assert.equal(created.manifest.template.interpreter, "none");
    assert.equal(created.image.manifest.settings?.workdir, "/srv");
    const result = await forkChildren(home, {
      tag: "oci-archive",
      n: 3,
      exec: [
        "sh",
        "-c",
        "echo mode=$SITE_MODE greeting=$GREETING; pwd; cat site/build.txt; " +
          "printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | nc -w 5 127.0.0.1 8080; ps",
      ],
    });
    for (const child of result.children) {
      assert.equal(child.error, null, `child ${child.index}: ${child.error}`);
      assert.equal(child.exit_code, 0, child.stderr);
      assert.match(child.stdout, /^mode=production greeting=hello$/m, "env step + the image's own env");
      assert.match(child.stdout, /^\/srv$/m, "the image's working directory is the default");
      assert.match(child.stdout, /^built-production$/m, "a run step's output");
      assert.match(child.stdout, /200 OK/, "the start service answers at once, in every child");
      assert.match(child.stdout, /hello from the site/);
      assert.match(
        child.stdout,
        /httpd -f -p 127\.0\.0\.1:8080/,
        "the parent's service process, still running",
      );
    }
    const evaluated = await forkChildren(home, { tag: "oci-archive", n: 1, eval: "1+1" });
    assert.match(
      evaluated.children[0]?.error ?? "",
      /no interpreter/,
      "no Python eval in an image without one",
    );
  });
});
