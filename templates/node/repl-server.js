// A warm Node.js evaluator. The template's `start` runs it in the parent before the snapshot, so every child
// has V8 started, these modules loaded and the evaluator's code already compiled: `node-eval CODE` in a
// child answers without starting Node. One request per connection on a Unix socket: the client sends code
// and closes its side; the answer is util.inspect of the (awaited) value, or the error's stack with exit
// status 1 (the first line of the answer says which: "ok" or "error"). State persists between calls, as
// in a REPL.

const fs = require("node:fs");
const net = require("node:net");
const util = require("node:util");
const vm = require("node:vm");

const SOCKET = process.env.NODE_REPL_SOCKET || "/run/node-repl.sock";
const MAX_CODE_BYTES = 1024 * 1024;

const context = vm.createContext({
  require,
  console,
  process,
  Buffer,
  URL,
  TextEncoder,
  TextDecoder,
  setTimeout,
  clearTimeout,
  setInterval,
  clearInterval,
  structuredClone,
});
// Loaded now, in the parent: children find them in memory.
for (const name of ["node:crypto", "node:path", "node:os", "node:child_process", "node:zlib"]) require(name);

async function evaluate(code) {
  try {
    const value = await vm.runInContext(code, context, { filename: "node-eval" });
    return `ok\n${util.inspect(value, { depth: 4 })}\n`;
  } catch (err) {
    return `error\n${err?.stack ? err.stack : String(err)}\n`;
  }
}

fs.rmSync(SOCKET, { force: true });
// Half-open: the client's end of input is the end of the code, and the answer still has to go back.
const server = net.createServer({ allowHalfOpen: true }, (socket) => {
  const chunks = [];
  let size = 0;
  socket.on("data", (chunk) => {
    size += chunk.length;
    if (size > MAX_CODE_BYTES) socket.destroy();
    else chunks.push(chunk);
  });
  socket.on("end", async () => socket.end(await evaluate(Buffer.concat(chunks).toString("utf8"))));
  socket.on("error", () => {});
});
server.listen(SOCKET, () => fs.chmodSync(SOCKET, 0o660));
// The evaluator's own paths compiled before the snapshot.
evaluate("[1, 2, 3].map((x) => x * 2)");
