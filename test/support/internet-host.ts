/**
 * The tests' "internet": run inside its own network namespace (by test/support/test-internet.ts), it serves
 * HTTP on port 80 of every address the namespace has (the answer names the address asked and the path) and
 * DNS on port 53 from the zone given as argv[2] (JSON); /bytes/<n> streams n zero bytes (throughput). Prints "ready" once both listen.
 */
import http from "node:http";
import { startDnsServer, type Zone } from "./dns-server.js";

const zone = JSON.parse(process.argv[2] ?? "{}") as Zone;
const dnsAddress = process.argv[3] ?? "0.0.0.0";
/** Streamed zero bytes for /bytes/<n> (throughput), at most 1 GiB. */
const CHUNK = Buffer.alloc(64 * 1024);
const server = http.createServer((req, res) => {
  const bytes = /^\/bytes\/(\d{1,10})$/.exec(req.url ?? "");
  if (bytes) {
    let left = Math.min(Number(bytes[1]), 1024 ** 3);
    res.writeHead(200, { "content-type": "application/octet-stream", "content-length": left });
    const pump = () => {
      while (left > 0) {
        const chunk = CHUNK.subarray(0, Math.min(left, CHUNK.length));
        left -= chunk.length;
        if (!res.write(chunk)) return void res.once("drain", pump);
      }
      res.end();
    };
    pump();
    return;
  }
  const body = JSON.stringify({
    host: req.socket.localAddress,
    path: req.url,
    from: req.socket.remoteAddress,
  });
  res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
  res.end(body);
});
await new Promise<void>((resolve) => server.listen(80, "0.0.0.0", () => resolve()));
await startDnsServer(zone, dnsAddress, 53);
process.stdout.write("ready\n");
