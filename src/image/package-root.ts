/** Locations inside the forkd package itself (built-in templates, the built guest payload). */
import path from "node:path";
import { packageRoot } from "../common/package-root.js";

export { packageRoot };

export const builtinTemplatesDir = () => path.join(packageRoot(), "templates");

/** The guest agent payload produced by `npm run build` (copied to /opt/forkd in every image). */
export const defaultGuestPayloadDir = () => path.join(packageRoot(), "dist", "guest");

/** Host-side build tools produced by `npm run build` (forkd-runas: a build step's credentials). */
export const defaultToolsDir = () => path.join(packageRoot(), "dist", "tools");
