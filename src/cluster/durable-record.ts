/**
 * The record of a durable pause (docs/kubernetes.md, "The durable pause"): what a node needs to insert a paused
 * sandbox it did not spawn — its tags, limits, metadata, env vars, network kind and policy, lifetime and its
 * data-plane tokens. It travels in the pausing node's ForkdNode status, sealed with AES-256-GCM under a key
 * derived (HKDF-SHA256) from the cluster credential, which only nodes, the gateway and the controller hold:
 * ForkdNodes are readable by more parties than the tokens Secret, and a record must be neither readable (it
 * holds tokens) nor alterable (it names tags that become paths). The seal binds the sandbox id and the pushed
 * digest as associated data, so a record cannot be moved onto another entry. An unsealed record is checked
 * field by field against RecordSchema before anything of it is used: every tag, id and tenant by the pattern
 * a path component needs.
 */
import { createCipheriv, createDecipheriv, hkdfSync, randomBytes } from "node:crypto";
import { type Static, Type } from "@sinclair/typebox";
import { Value } from "@sinclair/typebox/value";
import { SANDBOX_ID_PATTERN, TAG_PATTERN } from "../common/limits.js";
import { CLUSTER_LIMITS } from "./schemas.js";

const SEAL_VERSION = "v1";
const KEY_SALT = "forkd durable pause";
const KEY_INFO = "record seal v1";
const IV_BYTES = 12;
const TAG_BYTES = 16;
/** A record's JSON, before sealing (env vars and metadata are the big parts; a daemon bounds both). */
export const MAX_RECORD_JSON_BYTES = 8 * 1024;

const tag = Type.String({ pattern: TAG_PATTERN });
const json = (maxLength: number) => Type.String({ maxLength });

/** The fields of a sandbox row a node needs to adopt it (store/db.ts SandboxRow names them). */
export const RecordSchema = Type.Object(
  {
    id: Type.String({ pattern: SANDBOX_ID_PATTERN }),
    owner: Type.Union([Type.Null(), Type.String({ pattern: "^[a-z0-9][a-z0-9_-]{0,62}$" })]),
    snapshot_tag: tag,
    /** The chain the pause layer builds on, root first, then the pause layer itself (the last). */
    layer_tags: Type.Array(tag, { minItems: 1, maxItems: 80 }),
    pause_tag: tag,
    last_branch_tag: Type.Union([Type.Null(), tag]),
    memory_tag: Type.Union([Type.Null(), tag]),
    template_alias: Type.Union([Type.Null(), tag]),
    accelerator: Type.Union([Type.Literal("kvm"), Type.Literal("tcg")]),
    live_fork: Type.Integer({ minimum: 0, maximum: 1 }),
    created_at_unix: Type.Integer({ minimum: 0 }),
    memory_limit_mib: Type.Union([Type.Null(), Type.Integer({ minimum: 0 })]),
    limits: json(2048),
    metadata: json(4096),
    env_vars: json(4096),
    inbound: json(2048),
    network: Type.Union([Type.Literal("netns"), Type.Literal("private"), Type.Literal("none")]),
    /** The netns network's egress policy (JSON EgressPolicy), when it has one. */
    network_policy: Type.Union([Type.Null(), json(4096)]),
    access_token: Type.Union([Type.Null(), Type.String({ maxLength: 256 })]),
    traffic_token: Type.Union([Type.Null(), Type.String({ maxLength: 256 })]),
    timeout_ms: Type.Union([Type.Null(), Type.Integer({ minimum: 0 })]),
    on_timeout: Type.Union([Type.Literal("kill"), Type.Literal("pause")]),
    auto_resume: Type.Integer({ minimum: 0, maximum: 1 }),
    auto_pause_memory: Type.Integer({ minimum: 0, maximum: 1 }),
    paused_at_unix_ms: Type.Integer({ minimum: 0 }),
  },
  { additionalProperties: false },
);
export type DurableRecord = Static<typeof RecordSchema>;

export class RecordError extends Error {}

function keyOf(credential: string): Buffer {
  if (credential.length < 16) throw new RecordError("the cluster credential is too short to seal with");
  return Buffer.from(hkdfSync("sha256", credential, KEY_SALT, KEY_INFO, 32));
}

const associatedData = (id: string, digest: string) => Buffer.from(`${id}\n${digest}`);

/** The record sealed for the entry (id, digest): "v1." + base64url(iv | tag | ciphertext). */
export function sealRecord(record: DurableRecord, digest: string, credential: string): string {
  checkRecord(record);
  const plain = Buffer.from(JSON.stringify(record));
  if (plain.length > MAX_RECORD_JSON_BYTES) {
    throw new RecordError(`the sandbox's record is ${plain.length} bytes, over ${MAX_RECORD_JSON_BYTES}`);
  }
  const iv = randomBytes(IV_BYTES);
  const cipher = createCipheriv("aes-256-gcm", keyOf(credential), iv);
  cipher.setAAD(associatedData(record.id, digest));
  const body = Buffer.concat([cipher.update(plain), cipher.final()]);
  const sealed = `${SEAL_VERSION}.${Buffer.concat([iv, cipher.getAuthTag(), body]).toString("base64url")}`;
  if (sealed.length > CLUSTER_LIMITS.sealedRecordChars)
    throw new RecordError("the sealed record is too long");
  return sealed;
}

/**
 * The record of entry (id, digest), or RecordError: not sealed with this credential, altered, moved from
 * another entry, or with a field that is not what a node would write.
 */
export function unsealRecord(sealed: string, id: string, digest: string, credential: string): DurableRecord {
  const [version, payload, ...rest] = sealed.split(".");
  if (version !== SEAL_VERSION || payload === undefined || rest.length > 0) {
    throw new RecordError("the durable pause record is not a sealed v1 record");
  }
  const bytes = Buffer.from(payload, "base64url");
  if (bytes.length < IV_BYTES + TAG_BYTES + 2) throw new RecordError("the durable pause record is truncated");
  const decipher = createDecipheriv("aes-256-gcm", keyOf(credential), bytes.subarray(0, IV_BYTES));
  decipher.setAAD(associatedData(id, digest));
  decipher.setAuthTag(bytes.subarray(IV_BYTES, IV_BYTES + TAG_BYTES));
  let plain: Buffer;
  try {
    plain = Buffer.concat([decipher.update(bytes.subarray(IV_BYTES + TAG_BYTES)), decipher.final()]);
  } catch {
    throw new RecordError(
      `the durable pause record of ${id} does not verify (another credential, altered, or another entry's)`,
    );
  }
  let record: unknown;
  try {
    record = JSON.parse(plain.toString("utf8"));
  } catch {
    throw new RecordError("the durable pause record is not JSON");
  }
  checkRecord(record);
  if (record.id !== id) throw new RecordError(`the durable pause record names ${record.id}, not ${id}`);
  return record;
}

function checkRecord(record: unknown): asserts record is DurableRecord {
  if (Value.Check(RecordSchema, record)) {
    if (record.layer_tags.at(-1) !== record.pause_tag) {
      throw new RecordError("the durable pause record's chain does not end with its pause layer");
    }
    return;
  }
  const first = [...Value.Errors(RecordSchema, record)][0];
  throw new RecordError(`the durable pause record is invalid at ${first?.path || "/"}: ${first?.message}`);
}
