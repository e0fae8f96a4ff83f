import assert from "node:assert/strict";
import { test } from "node:test";
import {
  type DurableRecord,
  RecordError,
  sealRecord,
  unsealRecord,
} from "../../src/cluster/durable-record.js";

const credential = "node-token-0123456789abcdef";
const digest = `sha256:${"a".repeat(64)}`;
const record: DurableRecord = {
  id: "sb-0123456789ab",
  owner: "alpha",
  snapshot_tag: "pyagent",
  layer_tags: ["pyagent", "pause-sb-0123456789ab-1"],
  pause_tag: "pause-sb-0123456789ab-1",
  last_branch_tag: null,
  memory_tag: null,
  template_alias: null,
  accelerator: "tcg",
  live_fork: 0,
  created_at_unix: 1_700_000_000,
  memory_limit_mib: null,
  limits: "{}",
  metadata: '{"k":"v"}',
  env_vars: "{}",
  inbound: "{}",
  network: "private",
  network_policy: null,
  access_token: "secret-access",
  traffic_token: null,
  timeout_ms: 60_000,
  on_timeout: "kill",
  auto_resume: 0,
  auto_pause_memory: 1,
  paused_at_unix_ms: 1_700_000_000_000,
};

test("a sealed record opens with the credential for its entry, and hides its tokens", () => {
  const sealed = sealRecord(record, digest, credential);
  assert.ok(!sealed.includes("secret-access"));
  assert.ok(!Buffer.from(sealed.slice(3), "base64url").toString("latin1").includes("secret-access"));
  assert.deepEqual(unsealRecord(sealed, record.id, digest, credential), record);
});

test("another credential, another entry or one flipped byte is refused", () => {
  const sealed = sealRecord(record, digest, credential);
  assert.throws(() => unsealRecord(sealed, record.id, digest, `${credential}x`), RecordError);
  assert.throws(() => unsealRecord(sealed, "sb-ffffffffffff", digest, credential), RecordError);
  assert.throws(() => unsealRecord(sealed, record.id, `sha256:${"b".repeat(64)}`, credential), RecordError);
  const bytes = Buffer.from(sealed.slice(3), "base64url");
  bytes[bytes.length - 1] = (bytes[bytes.length - 1] as number) ^ 1;
  assert.throws(
    () => unsealRecord(`v1.${bytes.toString("base64url")}`, record.id, digest, credential),
    /does not verify/,
  );
  assert.throws(() => unsealRecord("v2.AAAA", record.id, digest, credential), /not a sealed v1/);
});

test("a record whose names could become paths outside forkd's is not sealed", () => {
  for (const bad of [
    { ...record, pause_tag: "../../etc", layer_tags: ["pyagent", "../../etc"] },
    { ...record, snapshot_tag: "a/b" },
    { ...record, id: "../sb" },
    { ...record, layer_tags: ["pyagent", "other"] },
    { ...record, extra: 1 } as DurableRecord,
  ]) {
    assert.throws(() => sealRecord(bad, digest, credential), RecordError);
  }
  assert.throws(() => sealRecord({ ...record, env_vars: "x".repeat(9000) }, digest, credential), RecordError);
});
