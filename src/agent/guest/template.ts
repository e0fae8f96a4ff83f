/** The template description the image builder writes to /opt/forkd/template.json. */
import { readFile } from "node:fs/promises";
import { Type } from "@sinclair/typebox";
import { errorMessage } from "../../common/errors.js";
import { isValidTag } from "../../common/names.js";
import { Interpreter, validator } from "../protocol/index.js";

export const DEFAULT_TEMPLATE_PATH = "/opt/forkd/template.json";

const TemplateFile = Type.Object({ name: Type.String({ maxLength: 64 }), interpreter: Interpreter });
const checkTemplate = validator(TemplateFile);

export interface TemplateInfo {
  name: string;
  interpreter: Interpreter;
  /** Why the file could not be used; the agent still serves, reporting warm state "failed". */
  problem: string | null;
}

export async function readTemplate(path: string): Promise<TemplateInfo> {
  try {
    const parsed: unknown = JSON.parse(await readFile(path, "utf8"));
    const file = checkTemplate.assert(parsed, path);
    if (!isValidTag(file.name))
      throw new Error(`${path}: invalid template name ${JSON.stringify(file.name)}`);
    return { name: file.name, interpreter: file.interpreter, problem: null };
  } catch (err) {
    return { name: "unknown", interpreter: "none", problem: `cannot use ${path}: ${errorMessage(err)}` };
  }
}
