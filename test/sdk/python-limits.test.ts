/**
 * The Python SDK's table of limits and names (sdk/python/forkd/_limits.py) is generated from src/common/limits.ts:
 * the committed file must be what the generator writes now, and every pattern must match in Python exactly what it
 * matches in JavaScript (checked by Python itself on probe strings, the awkward ones included).
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import path from "node:path";
import { describe, it } from "node:test";
import {
  PYTHON_LIMITS,
  pythonPattern,
  REPO_ROOT,
  renderPythonLimits,
} from "../../scripts/gen-python-limits.js";
import * as limits from "../../src/common/limits.js";

const PROBES = [
  "",
  "a",
  "pyagent",
  "py-agent_2.1",
  "-lead",
  ".hidden",
  "a/b",
  "team/name:v2",
  "sb-0123456789ab",
  "sb-0123456789AB",
  "sb-0123456789ab\n",
  "pyagent\n",
  "x".repeat(64),
  "x".repeat(65),
  "x".repeat(128),
  "x".repeat(129),
  "HOME",
  "_X1",
  "1X",
  "0755",
  "644",
  "7777",
  "08",
  "١٢٣",
  "é",
  "a b",
];

describe("sdk/python/forkd/_limits.py", () => {
  it("is what `npm run limits:python` writes from src/common/limits.ts", () => {
    const committed = readFileSync(PYTHON_LIMITS, "utf8");
    assert.ok(committed === renderPythonLimits(), `${PYTHON_LIMITS} is stale: run npm run limits:python`);
  });

  it("holds every constant of the table with its value", () => {
    const script =
      "import json, sys; sys.path.insert(0, sys.argv[1]); from forkd import _limits; " +
      "print(json.dumps({n: (dict(v) if n == 'ERROR_CODES' else list(v) if isinstance(v, tuple) else v) " +
      "for n in _limits.__all__ for v in [getattr(_limits, n)]}))";
    const out = execFileSync("python3", ["-c", script, path.join(REPO_ROOT, "sdk/python")], {
      encoding: "utf8",
    });
    assert.deepEqual(JSON.parse(out), JSON.parse(JSON.stringify(limits)));
  });

  it("has patterns Python's re.fullmatch reads as JavaScript does", () => {
    const patterns = Object.entries(limits).filter(([name]) => name.endsWith("_PATTERN")) as [
      string,
      string,
    ][];
    assert.ok(patterns.length >= 5, "the table has patterns");
    const script =
      "import json, re, sys; sys.path.insert(0, sys.argv[1]); from forkd import _limits; probes = json.loads(sys.argv[2]); " +
      "print(json.dumps({n: [re.fullmatch(getattr(_limits, n), p) is not None for p in probes] " +
      "for n in _limits.__all__ if n.endswith('_PATTERN')}))";
    const out = execFileSync(
      "python3",
      ["-c", script, path.join(REPO_ROOT, "sdk/python"), JSON.stringify(PROBES)],
      { encoding: "utf8" },
    );
    const python = JSON.parse(out) as Record<string, boolean[]>;
    for (const [name, pattern] of patterns) {
      const javascript = PROBES.map((probe) => new RegExp(pattern).test(probe));
      assert.deepEqual(python[name], javascript, `${name} matches the same probes in both languages`);
      assert.ok(
        javascript.some(Boolean) && !javascript.every(Boolean),
        `${name}: the probes tell matches apart`,
      );
    }
  });

  it("refuses a pattern Python would read differently", () => {
    assert.equal(pythonPattern("^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"), "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$");
    for (const bad of ["^a.b$", "^\\d+$", "^\\w$", "^\\s$", "^(?=a)b$", "^a|b$", "abc", "^[é]$", "^[a-z$"]) {
      assert.throws(() => pythonPattern(bad), /cannot be translated to Python/, bad);
    }
  });
});
