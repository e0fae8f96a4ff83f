/**
 * envd's protocol is declared once, in src/e2b/envd/proto: its generated code must be what protoc-gen-es makes of
 * it today, and its wire must be E2B's: every message, field (name, number, type, label, oneof), enum value and
 * method of the descriptors embedded in the installed e2b SDK, and nothing else.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { createRequire } from "node:module";
import os from "node:os";
import path from "node:path";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { fromBinary } from "@bufbuild/protobuf";
import {
  type DescriptorProto,
  type EnumDescriptorProto,
  type FileDescriptorProto,
  FileDescriptorProtoSchema,
} from "@bufbuild/protobuf/wkt";
import { file_filesystem_filesystem } from "../../src/e2b/envd/gen/filesystem/filesystem_pb.js";
import { file_process_process } from "../../src/e2b/envd/gen/process/process_pb.js";

const execFileAsync = promisify(execFile);

function sourceRoot(): string {
  let dir = path.dirname(fileURLToPath(import.meta.url));
  while (!existsSync(path.join(dir, "package.json"))) dir = path.dirname(dir);
  return dir;
}

/** The FileDescriptorProtos the SDK embeds (base64, as protoc-gen-es writes them). */
async function sdkDescriptors(): Promise<Map<string, FileDescriptorProto>> {
  const require = createRequire(import.meta.url);
  const source = await readFile(require.resolve("e2b"), "utf8");
  const out = new Map<string, FileDescriptorProto>();
  for (const match of source.matchAll(/fileDesc\)\("([A-Za-z0-9+/=_-]+)"/g)) {
    const bytes = Buffer.from((match[1] as string).replaceAll("-", "+").replaceAll("_", "/"), "base64");
    const file = fromBinary(FileDescriptorProtoSchema, bytes);
    out.set(file.package, file);
  }
  return out;
}

/** A descriptor's wire-relevant facts, as sorted lines: what two declarations must agree on. */
function wireFacts(file: FileDescriptorProto): string[] {
  const lines: string[] = [`package ${file.package}`];
  const message = (m: DescriptorProto, prefix: string) => {
    const name = `${prefix}${m.name}`;
    lines.push(`message ${name}${m.options?.mapEntry ? " (map entry)" : ""}`);
    for (const f of m.field) {
      const oneof =
        f.oneofIndex !== undefined && !f.proto3Optional ? ` oneof=${m.oneofDecl[f.oneofIndex]?.name}` : "";
      lines.push(
        `field ${name}.${f.name} = ${f.number} type=${f.type} label=${f.label} ref=${f.typeName}` +
          `${oneof}${f.proto3Optional ? " optional" : ""}`,
      );
    }
    for (const nested of m.nestedType) message(nested, `${name}.`);
    for (const e of m.enumType) enumFacts(e, `${name}.`);
  };
  const enumFacts = (e: EnumDescriptorProto, prefix: string) => {
    for (const v of e.value) lines.push(`enum ${prefix}${e.name}.${v.name} = ${v.number}`);
  };
  for (const m of file.messageType) message(m, "");
  for (const e of file.enumType) enumFacts(e, "");
  for (const s of file.service) {
    for (const m of s.method) {
      lines.push(
        `rpc ${s.name}.${m.name}(${m.clientStreaming ? "stream " : ""}${m.inputType}) returns ` +
          `(${m.serverStreaming ? "stream " : ""}${m.outputType})`,
      );
    }
  }
  return lines.sort();
}

describe("envd protocol", () => {
  it("matches the wire of the descriptors embedded in the installed e2b SDK", async () => {
    const sdk = await sdkDescriptors();
    for (const ours of [file_process_process.proto, file_filesystem_filesystem.proto]) {
      const theirs = sdk.get(ours.package);
      assert.ok(theirs, `the SDK embeds a descriptor of package ${ours.package}`);
      assert.deepEqual(wireFacts(ours), wireFacts(theirs));
    }
  });

  it("generated code is what `npm run gen:envd` makes of the .proto files (run it if not)", async () => {
    const root = sourceRoot();
    const envd = path.join(root, "src", "e2b", "envd");
    const out = await mkdtemp(path.join(os.tmpdir(), "forkd-envd-gen-"));
    try {
      const bin = path.join(root, "node_modules", ".bin");
      await execFileAsync(path.join(bin, "buf"), ["generate", "-o", out], {
        cwd: envd,
        env: { ...process.env, PATH: `${bin}:${process.env.PATH ?? ""}` },
      });
      for (const file of ["process/process_pb.ts", "filesystem/filesystem_pb.ts"]) {
        const fresh = await readFile(path.join(out, "gen", file), "utf8");
        const committed = await readFile(path.join(envd, "gen", file), "utf8");
        assert.equal(committed, fresh, `src/e2b/envd/gen/${file} is stale`);
      }
    } finally {
      await rm(out, { recursive: true, force: true });
    }
  });
});
