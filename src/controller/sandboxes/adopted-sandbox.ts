/**
 * A sandbox whose QEMU outlived the daemon that started it. The new daemon re-attaches: QMP on the sandbox's
 * socket, and the agent and console chardevs pointed at fresh host listeners with QMP `chardev-change` (the
 * console log continues where the old daemon left it).
 */
import { rm } from "node:fs/promises";
import path from "node:path";
import { AgentClient } from "../../agent/host/client.js";
import { deadlineSignal } from "../../common/deadline.js";
import type { ProcessIdentity } from "../../common/processes.js";
import { processUid } from "../../isolation/identity.js";
import { ConsoleLog } from "../../vmm/console-log.js";
import { reattachAgent, reattachConsole } from "../../vmm/launch.js";
import { QmpClient } from "../../vmm/qmp.js";
import type { FileOwner } from "../../vmm/unix-listener.js";
import { killAndWait } from "../host/processes.js";
import { RUN_FILES } from "../machines/machine.js";
import type { SandboxHandle } from "../machines/sandbox-vm.js";

/**
 * Re-attaching is QMP connect + chardev-change + one ping; a VM that cannot do that in time is not healthy. Short,
 * because the API serves meanwhile and every sandbox is re-attached in parallel: one unresponsive guest must not
 * hold the others (or a kill of it) for long.
 */
export const REATTACH_TIMEOUT_MS = 20_000;

export class AdoptedSandbox implements SandboxHandle {
  private destroyed: Promise<void> | undefined;

  private constructor(
    readonly id: string,
    /** The QEMU we re-attached to: only this very process is ever signalled (see host/processes.ts). */
    readonly identity: ProcessIdentity,
    readonly runDir: string,
    readonly snapshotTag: string,
    readonly memoryImage: string,
    readonly agent: AgentClient,
    readonly vmOwner: FileOwner | null,
    readonly console: ConsoleLog,
    private readonly qmpClient: QmpClient,
  ) {}

  get pid(): number {
    return this.identity.pid;
  }

  static async adopt(
    row: {
      id: string;
      identity: ProcessIdentity;
      run_dir: string;
      snapshot_tag: string;
      memory_image: string;
    },
    options: { callTimeoutMs: number; consoleLogBytes?: number },
  ): Promise<AdoptedSandbox> {
    const { id, identity, run_dir: runDir } = row;
    const { signal, dispose } = deadlineSignal(REATTACH_TIMEOUT_MS);
    const qmp = await QmpClient.connect(path.join(runDir, RUN_FILES.qmpSocket), { signal });
    let console: ConsoleLog | undefined;
    try {
      // A daemon that died mid-BRANCH or mid-pause (before its layer was published) can leave its source stopped:
      // running is the only state a sandbox of ours is left in with a QEMU, so continue it (a paused sandbox has
      // none). Before the re-attach: a stopped VM's virtio-serial port has no backend handlers, and
      // chardev-change then fails ("does not support chardev hotswap").
      const status = (await qmp.execute("query-status", {}, { signal })) as { status?: string };
      if (status.status === "paused") await qmp.execute("cont", {}, { signal });
      // An unprivileged QEMU may only connect to sockets handed to its uid.
      const uid = await processUid(identity.pid);
      const owner = uid === process.getuid?.() ? null : { uid, gid: uid };
      const ownerOption = owner ? { owner } : {};
      console = await ConsoleLog.open(path.join(runDir, RUN_FILES.console), options.consoleLogBytes);
      await reattachConsole(qmp, path.join(runDir, RUN_FILES.consoleSocket), console, {
        signal,
        ...ownerOption,
      });
      const socket = await reattachAgent(qmp, path.join(runDir, RUN_FILES.agentSocket), {
        signal,
        ...ownerOption,
      });
      const agent = new AgentClient(socket, { callTimeoutMs: options.callTimeoutMs });
      await agent.ping({ signal });
      return new AdoptedSandbox(
        id,
        identity,
        runDir,
        row.snapshot_tag,
        row.memory_image,
        agent,
        owner,
        console,
        qmp,
      );
    } catch (err) {
      qmp.close();
      await console?.close();
      throw err;
    } finally {
      dispose();
    }
  }

  async qmp(): Promise<QmpClient> {
    return this.qmpClient;
  }

  release(): void {
    this.agent.close();
    this.qmpClient.close();
  }

  destroy(): Promise<void> {
    this.destroyed ??= (async () => {
      this.agent.close();
      this.qmpClient.close();
      await killAndWait(this.identity);
      await this.console.close();
      await rm(this.runDir, { recursive: true, force: true });
    })();
    return this.destroyed;
  }
}
