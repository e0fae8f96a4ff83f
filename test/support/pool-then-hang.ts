/**
 * Child-process helper for the "daemon killed with a full networked pool" test: opens the daemon's services on
 * FORKD_HOME with a warm pool of <size> VMs of <tag> (netns mode: each with a network prepared), prints "full"
 * once the pool is, and waits; the test SIGKILLs this process then.
 *   argv: <snapshot tag> <size> <dns upstream>
 */
import { resolvePaths } from "../../src/common/paths.js";
import { openServices } from "../../src/controller/sandboxes/manager.js";

const [tag, size, dns] = process.argv.slice(2);
const services = await openServices(resolvePaths(), {
  warmPools: [{ tag: tag as string, size: Number(size) }],
  network: { network: { dnsUpstreams: [dns as string] } },
});
for (;;) {
  const ready = services.sandboxes.warmPoolStats().find((s) => s.tag === tag)?.ready ?? 0;
  if (ready >= Number(size)) break;
  await new Promise((r) => setTimeout(r, 50));
}
process.stdout.write("full\n");
await new Promise(() => {});
