/**
 * The Go side of the protocol is generated from the TypeBox declaration: the committed file must be what the
 * generator writes now, and the generator must refuse patterns RE2 would read differently.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import path from "node:path";
import { describe, it } from "node:test";
import { generateGo, translatePattern } from "../../src/agent/protocol/gen-go.js";
import { repoRoot } from "./harness.js";

describe("generated Go protocol", () => {
  it("is up to date with src/agent/protocol (npm run gen:agent)", () => {
    const generated = execFileSync("gofmt", [], { input: generateGo(), encoding: "utf8" });
    const committed = readFileSync(path.join(repoRoot(), "src/agent/guest/protocol/protocol_gen.go"), "utf8");
    assert.ok(
      generated === committed,
      "src/agent/guest/protocol/protocol_gen.go is stale: run npm run gen:agent",
    );
  });

  it("covers every op and header kind", () => {
    const go = generateGo();
    for (const op of ["ping", "exec", "proc.start", "watch", "context.create", "file.move"]) {
      assert.match(go, new RegExp(`"${op.replace(".", "\\.")}": \\{Name: "${op.replace(".", "\\.")}"`));
    }
    for (const type of ["HelloHeader", "RequestHeader", "ResultHeader", "ErrorHeader", "EventHeader"]) {
      assert.match(go, new RegExp(`type ${type} struct`));
    }
  });

  it("translates the protocol's patterns and refuses what RE2 reads differently", () => {
    assert.equal(translatePattern("^/[^\\x00]*$"), "^/[^\\x00]*$");
    assert.equal(translatePattern("^[a-z_][a-z0-9_-]*\\$?$"), "^[a-z_][a-z0-9_-]*\\$?$");
    assert.equal(translatePattern("^a+?[^x]*$"), "^a+?[^x]*$");
    for (const bad of ["^a.b$", "^\\d+$", "^\\w$", "^(?=a)", "^[^x]{3}$", "^a$|^b", "^[é]$"]) {
      assert.throws(() => translatePattern(bad), /cannot be translated/, bad);
    }
  });
});
