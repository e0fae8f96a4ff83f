/**
 * Calls into a running sandbox's guest agent, as the service makes them: exec, eval, files, processes and
 * interpreter contexts, with the sandbox's env vars laid under each call's, each waiting for its own sandbox's
 * re-attach after a restart and failing as "killed" or "paused" when that cut it short (LiveSandboxes.call).
 */

import type { EvalOptions, ExecOptions } from "../../agent/host/types.js";
import { invalidArgument } from "../../common/errors.js";
import type { SandboxService } from "../sandbox-service.js";
import type { LiveSandboxes } from "./live-sandboxes.js";
import { layerEnv, parseStringMap } from "./settings.js";

type Calls = Pick<SandboxService, "ping" | "exec" | "eval" | "envVars" | "files" | "procs" | "contexts">;

export class GuestCalls implements Calls {
  constructor(private readonly live: LiveSandboxes) {}

  envVars(id: string): Record<string, string> {
    return parseStringMap(this.live.row(id).env_vars);
  }

  ping(id: string, options: { signal?: AbortSignal } = {}) {
    return this.live.call(id, (agent) => agent.ping(options));
  }

  /** Memory and disk use as the sandbox's guest sees them (metrics). */
  stats(id: string, options: { signal?: AbortSignal } = {}) {
    return this.live.call(id, (agent) => agent.stats(options));
  }

  async exec(id: string, argv: string[], options: ExecOptions = {}) {
    if (!Array.isArray(argv) || argv.length === 0)
      throw invalidArgument("args must be a non-empty array of strings");
    const env = layerEnv(this.envVars(id), options.env);
    return this.live.call(id, (agent) => agent.exec(argv, { ...options, env }));
  }

  async eval(id: string, code: string, options: EvalOptions = {}) {
    const env = layerEnv(this.envVars(id), options.env);
    return this.live.call(id, (agent) => agent.eval(code, env === undefined ? options : { ...options, env }));
  }

  readonly files: SandboxService["files"] = {
    write: (id, file, data, options = {}) =>
      this.live.call(id, (agent) => agent.files.write(file, data, options)),
    read: (id, file, options = {}) => this.live.call(id, (agent) => agent.files.read(file, options)),
    list: (id, file, options = {}) => this.live.call(id, (agent) => agent.files.list(file, options)),
    stat: (id, file, options = {}) => this.live.call(id, (agent) => agent.files.stat(file, options)),
    remove: (id, file, options = {}) => this.live.call(id, (agent) => agent.files.remove(file, options)),
    mkdir: (id, file, options = {}) => this.live.call(id, (agent) => agent.files.mkdir(file, options)),
    move: (id, source, destination, options = {}) =>
      this.live.call(id, (agent) => agent.files.move(source, destination, options)),
    watch: (id, file, options = {}) => this.live.running(id).handle.agent.files.watch(file, options),
  };

  readonly procs: SandboxService["procs"] = {
    start: (id, argv, options = {}) => {
      const env = layerEnv(this.envVars(id), options.env);
      return this.live.running(id).handle.agent.procs.start(argv, { ...options, env });
    },
    connect: (id, selector, options = {}) =>
      this.live.running(id).handle.agent.procs.connect(selector, options),
    list: (id, options = {}) => this.live.call(id, (agent) => agent.procs.list(options)),
    input: (id, selector, data, options = {}) =>
      this.live.call(id, (agent) => agent.procs.input(selector, data, options)),
    closeStdin: (id, selector, options = {}) =>
      this.live.call(id, (agent) => agent.procs.closeStdin(selector, options)),
    signal: (id, selector, signal, options = {}) =>
      this.live.call(id, (agent) => agent.procs.signal(selector, signal, options)),
    resize: (id, selector, size, options = {}) =>
      this.live.call(id, (agent) => agent.procs.resize(selector, size, options)),
  };

  readonly contexts: SandboxService["contexts"] = {
    create: (id, options = {}) => this.live.call(id, (agent) => agent.contexts.create(options)),
    list: (id, options = {}) => this.live.call(id, (agent) => agent.contexts.list(options)),
    restart: (id, context, options = {}) =>
      this.live.call(id, (agent) => agent.contexts.restart(context, options)),
    remove: (id, context, options = {}) =>
      this.live.call(id, (agent) => agent.contexts.remove(context, options)),
  };
}
