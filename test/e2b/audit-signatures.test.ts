/**
 * A signed file URL's signature opens the sandbox's files until it expires, so it never reaches the audit log
 * or the request log (issue 20, Low): an upload through an E2B SDK's signed URL is audited with the signature's
 * value redacted. Real listener, the real E2B SDK, the HTTP-level services double, a real audit log file.
 */
import assert from "node:assert/strict";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { Sandbox } from "@e2b/code-interpreter";
import type { FastifyInstance } from "fastify";
import { buildApi } from "../../src/api/app.js";
import { AuditLog, redactUrl } from "../../src/api/audit.js";
import { tokenFromString } from "../../src/common/tokens.js";
import { ServicesDouble } from "../api/services-double.js";

const TOKEN = "e2b-audit-signature-test-token-0123";
const DOMAIN = "sandbox.test";

describe("signed URLs and the audit log", () => {
  let dir: string;
  let app: FastifyInstance;
  let audit: AuditLog;
  let url: string;
  let closed = false;
  const double = new ServicesDouble();

  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "forkd-audit-sig-"));
    audit = await AuditLog.open(path.join(dir, "audit.log"), () => {});
    app = await buildApi({
      services: double,
      snapshotsDir: "/s",
      transport: "tcp",
      tokens: [tokenFromString(TOKEN)],
      origin: { bindHost: "127.0.0.1", allowedHosts: [`*.${DOMAIN}`] },
      audit,
    });
    await app.listen({ host: "127.0.0.1", port: 0 });
    url = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
  });
  after(async () => {
    await app?.close();
    if (!closed) await audit?.close();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it("redacts the signature of an upload through a signed URL", async () => {
    const sbx = await Sandbox.create("py", { apiUrl: url, sandboxUrl: url, apiKey: TOKEN });
    double.filesByPath.set(
      `${sbx.sandboxId}:/etc/passwd`,
      Buffer.from("root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n"),
    );
    const signed = new URL(await sbx.uploadUrl("/home/user/up.txt"));
    const signature = signed.searchParams.get("signature") as string;
    assert.ok(signature.length > 10, signed.toString());
    const boundary = "forkd-audit-boundary";
    const body = `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="up.txt"\r\nContent-Type: application/octet-stream\r\n\r\nuploaded\r\n--${boundary}--\r\n`;
    const status = await new Promise<number>((resolve, reject) => {
      const req = http.request(
        `${url}${signed.pathname}${signed.search}`,
        {
          method: "POST",
          headers: {
            host: `49983-${sbx.sandboxId}.${DOMAIN}`,
            "content-type": `multipart/form-data; boundary=${boundary}`,
          },
        },
        (res) => {
          res.resume();
          res.on("end", () => resolve(res.statusCode ?? 0));
        },
      );
      req.on("error", reject);
      req.end(body);
    });
    // The double stores no uploads (501); what matters is that the signature was accepted, then audited.
    assert.notEqual(status, 401, "the signature opened the files route");
    closed = true;
    await audit.close();
    const lines = (await readFile(path.join(dir, "audit.log"), "utf8")).trim().split("\n");
    const upload = lines.map((l) => JSON.parse(l) as { url: string }).find((l) => l.url.startsWith("/files"));
    assert.ok(upload, lines.join("\n"));
    assert.match(upload.url, /signature=redacted/);
    assert.ok(!lines.join("\n").includes(signature), "the signature is in no audit line");
  });

  it("leaves other query parameters as they are", () => {
    assert.equal(
      redactUrl("/files?path=%2Fa&signature=v1_x&signature_expiration=9&Token=t"),
      "/files?path=%2Fa&signature=redacted&signature_expiration=9&Token=redacted",
    );
    assert.equal(redactUrl("/v1/sandboxes"), "/v1/sandboxes");
  });
});
