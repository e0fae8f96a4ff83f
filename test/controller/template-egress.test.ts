/**
 * A template's `[egress]`: checked with a spawn policy's rules (errors name the TOML field) before anything is
 * built, and how a spawn's or an update's policy is completed from it.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { completeEgress } from "../../src/controller/networks/sandbox-networks.js";
import { templateEgressPolicy } from "../../src/controller/snapshots/create.js";

const template = (egress: { default: "allow" | "deny"; allowOut?: string[]; denyOut?: string[] }) => ({
  name: "t",
  memoryMib: 256,
  vcpus: 1,
  interpreter: "none" as const,
  source: "/tpl/template.toml",
  egress: { allowOut: [], denyOut: [], ...egress },
});

describe("a template's egress default", () => {
  test("is put in canonical form, as a spawn's policy is", () => {
    assert.deepEqual(
      templateEgressPolicy(template({ default: "allow", denyOut: ["Evil.Test", "10.1.2.3/8", "evil.test"] })),
      { default: "allow", allowOut: [], denyOut: ["10.0.0.0/8", "evil.test"] },
    );
    assert.deepEqual(
      templateEgressPolicy(template({ default: "allow", allowOut: ["pypi.org"], denyOut: ["0.0.0.0/0"] })),
      { default: "deny", allowOut: ["pypi.org"], denyOut: [] },
      "0.0.0.0/0 in deny_out means default deny",
    );
    assert.equal(templateEgressPolicy({ ...template({ default: "deny" }), egress: undefined }), undefined);
  });

  test("a bad entry is refused naming the file and the TOML field", () => {
    assert.throws(
      () => templateEgressPolicy(template({ default: "deny", allowOut: ["ok.test", "not a name"] })),
      (err: Error) =>
        err.message.includes("/tpl/template.toml: egress.allow_out") && err.message.includes("not a name"),
    );
    assert.throws(
      () => templateEgressPolicy(template({ default: "deny", denyOut: ["300.1.1.1/8"] })),
      /egress\.deny_out/,
    );
  });

  test("fields a request leaves out come from it; given fields replace its", () => {
    const base = { default: "deny" as const, allowOut: ["pypi.org"], denyOut: ["evil.test"] };
    assert.deepEqual(completeEgress({}, base), base);
    assert.deepEqual(completeEgress({ allowOut: ["github.com"] }, base), {
      default: "deny",
      allowOut: ["github.com"],
      denyOut: ["evil.test"],
    });
    assert.deepEqual(completeEgress({ default: "allow", allowOut: undefined }, base), {
      default: "allow",
      allowOut: ["pypi.org"],
      denyOut: ["evil.test"],
    });
    assert.deepEqual(completeEgress({ default: "allow", allowOut: [], denyOut: [] }, base), {
      default: "allow",
      allowOut: [],
      denyOut: [],
    });
    assert.throws(() => completeEgress({ allowOut: ["bad name"] }, base), /allowOut/);
  });
});
