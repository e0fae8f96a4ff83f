/**
 * The agent's log: one JSON line per event on stderr (the guest console under tini, the test's stderr with
 * --stdio). Never stdout: with --stdio, stdout is the protocol.
 */
export type LogFields = Record<string, unknown>;

export interface AgentLog {
  info(msg: string, fields?: LogFields): void;
  warn(msg: string, fields?: LogFields): void;
  error(msg: string, fields?: LogFields): void;
}

export function createLog(write: (line: string) => void = (line) => process.stderr.write(line)): AgentLog {
  const emit = (level: string, msg: string, fields?: LogFields) => {
    let line: string;
    try {
      line = JSON.stringify({ level, src: "forkd-agent", msg, ...fields });
    } catch {
      line = JSON.stringify({ level, src: "forkd-agent", msg });
    }
    write(`${line}\n`);
  };
  return {
    info: (msg, fields) => emit("info", msg, fields),
    warn: (msg, fields) => emit("warn", msg, fields),
    error: (msg, fields) => emit("error", msg, fields),
  };
}
