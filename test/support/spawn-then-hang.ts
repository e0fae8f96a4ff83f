/**
 * Child-process helper for the "daemon killed mid-spawn" test: opens the daemon's services on FORKD_HOME and
 * starts spawning; the test SIGKILLs this process while the children are starting.
 *   argv: <snapshot tag> <n>
 */
import { resolvePaths } from "../../src/common/paths.js";
import { openServices } from "../../src/controller/sandboxes/manager.js";

const [tag, n] = process.argv.slice(2);
const services = await openServices(resolvePaths());
process.stdout.write("spawning\n");
await services.sandboxes.spawn({ snapshotTag: tag as string, n: Number(n) });
process.stdout.write("spawned\n");
await new Promise(() => {});
