/** Content hashing of snapshot files. */
import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { stat } from "node:fs/promises";

export interface FileDigest {
  size: number;
  sha256: string;
}

export async function digestFile(file: string, signal?: AbortSignal): Promise<FileDigest> {
  const hash = createHash("sha256");
  const stream = createReadStream(file, { highWaterMark: 1 << 20, signal });
  for await (const chunk of stream) hash.update(chunk as Buffer);
  const { size } = await stat(file);
  return { size, sha256: hash.digest("hex") };
}
