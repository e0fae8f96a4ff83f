/**
 * Recipe tests build the recipes in templates/ as users would. Recipes that need an image file next to them
 * (oci-archive, dockerfile) are copied to a temporary directory, where the test makes that file.
 */
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { builtinTemplatesDir } from "../../src/image/package-root.js";
import { RECIPE_TEMPLATE_FILE } from "../../src/image/template.js";

/** A copy of templates/<name>/ in a new temporary directory; returns the copy's template file. */
export async function copyRecipe(
  name: string,
): Promise<{ dir: string; template: string; cleanup(): Promise<void> }> {
  const root = await fs.mkdtemp(path.join(os.tmpdir(), `forkd-recipe-${name}-`));
  const dir = path.join(root, name);
  await fs.cp(path.join(builtinTemplatesDir(), name), dir, { recursive: true });
  return {
    dir,
    template: path.join(dir, RECIPE_TEMPLATE_FILE),
    cleanup: () => fs.rm(root, { recursive: true, force: true }),
  };
}
