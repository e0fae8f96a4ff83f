/**
 * The dockerfile recipe on real VMs: buildah builds its Dockerfile (FROM an OCI archive the test makes, ARG,
 * ENV, WORKDIR, COPY, RUN) with no daemon and no network, and the effects are visible in every child.
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

describe("recipe dockerfile", { skip: !isRoot && "needs root", timeout: 20 * 60_000 }, () => {
  let home: Awaited<ReturnType<typeof tempHome>>;
  let recipe: Awaited<ReturnType<typeof copyRecipe>>;

  before(async () => {
    home = await tempHome("forkd-recipe-dockerfile-");
    recipe = await copyRecipe("dockerfile");
    const layout = await makeBusyboxLayout(path.join(recipe.dir, "..", "img"));
    await saveArchive(layout, "oci-archive", path.join(recipe.dir, "base.tar"));
  });

  after(async () => {
    assert.deepEqual(await qemusMentioning(home.home), [], "no QEMU left running");
    await home.cleanup();
    await recipe.cleanup();
  });

  it("a Dockerfile with RUN/COPY/ENV/WORKDIR builds with buildah and its effects are visible in children", async () => {
    const created = await createSnapshot(home, {
      tag: "dockerfile",
      template: recipe.template,
      templateFiles: true,
    });
    assert.equal(created.image.manifest.settings?.workdir, "/app");
    const result = await forkChildren(home, {
      tag: "dockerfile",
      n: 2,
      exec: ["sh", "-c", "echo mode=$APP_MODE; pwd; ./run.sh; test -d data && echo has-data"],
    });
    for (const child of result.children) {
      assert.equal(child.error, null, `child ${child.index}: ${child.error}`);
      assert.equal(child.exit_code, 0, child.stderr);
      assert.match(child.stdout, /^mode=dockerfile$/m, "ENV");
      assert.match(child.stdout, /^\/app$/m, "WORKDIR");
      assert.match(
        child.stdout,
        /^app says: dockerfile built-with-forkd$/m,
        "COPY, RUN, ARG from the template",
      );
      assert.match(child.stdout, /^has-data$/m);
    }
  });
});
