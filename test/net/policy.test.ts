/** Egress policies: parsing to canonical form, the errors a bad entry gets, and E2B's precedence rules. */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { ForkdError } from "../../src/common/errors.js";
import { MAX_POLICY_ENTRIES } from "../../src/common/limits.js";
import {
  compilePolicy,
  domainMatches,
  nameIsAllowed,
  nameIsExplicitlyAllowed,
  parseEgressPolicy,
} from "../../src/net/policy.js";

const invalid = (pattern: RegExp) => (err: unknown) =>
  err instanceof ForkdError && err.code === "invalid_argument" && pattern.test(err.message);

describe("egress policy", () => {
  it("canonicalises entries: lower case, host bits cleared, no trailing dot, sorted, deduplicated", () => {
    const policy = parseEgressPolicy({
      default: "allow",
      allowOut: ["Example.ORG.", "10.1.2.3/8", "10.0.0.0/8", "*.Wild.Test", "1.2.3.4/32"],
      denyOut: [" 192.168.7.9 "],
    });
    assert.deepEqual(policy, {
      default: "allow",
      allowOut: ["*.wild.test", "1.2.3.4", "10.0.0.0/8", "example.org"],
      denyOut: ["192.168.7.9"],
    });
  });

  it("treats 0.0.0.0/0 in denyOut as default deny (E2B's ALL_TRAFFIC)", () => {
    const policy = parseEgressPolicy({
      default: "allow",
      allowOut: ["1.1.1.1"],
      denyOut: ["0.0.0.0/0", "8.8.8.8"],
    });
    assert.deepEqual(policy, { default: "deny", allowOut: ["1.1.1.1"], denyOut: ["8.8.8.8"] });
  });

  it("refuses what it cannot enforce, naming the entry", () => {
    assert.throws(
      () => parseEgressPolicy({ default: "maybe" }),
      invalid(/default must be "allow" or "deny"/),
    );
    assert.throws(() => parseEgressPolicy({ default: "deny", allowOut: ["2001:db8::/32"] }), invalid(/IPv6/));
    assert.throws(
      () => parseEgressPolicy({ default: "deny", allowOut: ["example.org:443"] }),
      invalid(/port/),
    );
    assert.throws(
      () => parseEgressPolicy({ default: "deny", allowOut: ["10.0.0.0/33"] }),
      invalid(/10\.0\.0\.0\/33/),
    );
    assert.throws(() => parseEgressPolicy({ default: "deny", allowOut: ["1.2.3"] }), invalid(/not an IPv4/));
    assert.throws(
      () => parseEgressPolicy({ default: "deny", denyOut: ["bad_name!.org"] }),
      invalid(/bad_name/),
    );
    assert.throws(() => parseEgressPolicy({ default: "deny", denyOut: ["a.*.org"] }), invalid(/a\.\*\.org/));
    assert.throws(() => parseEgressPolicy({ default: "deny", allowOut: "example.org" }), invalid(/array/));
    assert.throws(() => parseEgressPolicy({ default: "deny", extra: 1 }), invalid(/unknown field "extra"/));
    const many = Array.from({ length: MAX_POLICY_ENTRIES + 1 }, (_, i) => `h${i}.example.org`);
    assert.throws(() => parseEgressPolicy({ default: "deny", allowOut: many }), invalid(/at most/));
  });

  it("wildcards match every name below the domain, not the domain itself", () => {
    assert.ok(domainMatches("*.example.org", "a.example.org"));
    assert.ok(domainMatches("*.example.org", "a.b.example.org"));
    assert.ok(!domainMatches("*.example.org", "example.org"));
    assert.ok(!domainMatches("*.example.org", "badexample.org"));
    assert.ok(domainMatches("example.org", "example.org"));
    assert.ok(!domainMatches("example.org", "a.example.org"));
  });

  it("lets an allow entry win over a deny entry, and the default decide the rest", () => {
    const deny = compilePolicy(
      parseEgressPolicy({
        default: "deny",
        allowOut: ["api.example.org", "10.0.0.0/8"],
        denyOut: ["*.example.org"],
      }),
    );
    assert.equal(nameIsAllowed(deny, "api.example.org"), true, "allow wins over the deny wildcard");
    assert.equal(nameIsAllowed(deny, "www.example.org"), false);
    assert.equal(nameIsAllowed(deny, "elsewhere.test"), false, "default deny");
    assert.equal(nameIsExplicitlyAllowed(deny, "api.example.org"), true);
    assert.deepEqual(deny.allowNets, [{ address: "10.0.0.0", prefix: 8 }]);
    const allow = compilePolicy(parseEgressPolicy({ default: "allow", denyOut: ["*.example.org"] }));
    assert.equal(nameIsAllowed(allow, "www.example.org"), false);
    assert.equal(nameIsAllowed(allow, "elsewhere.test"), true, "default allow");
    assert.equal(nameIsExplicitlyAllowed(allow, "elsewhere.test"), false, "resolves, but is not pinned");
  });
});
