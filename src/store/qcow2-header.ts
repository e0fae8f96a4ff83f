/**
 * The parts of a qcow2 header forkd needs: its virtual size, and where it reads through to. A disk layer from
 * a pack is hostile input that QEMU will open as root, so before any QEMU tool touches it its header is read
 * here and held to what forkd itself writes: a relative backing file of a known format, no external data file,
 * no encryption, no internal snapshots (spec: docs/interop/qcow2.txt in QEMU's sources).
 */
import { open } from "node:fs/promises";
import { ForkdError } from "../common/errors.js";

const QCOW2_MAGIC = 0x514649fb;
const V2_HEADER_BYTES = 72;
/** Header plus extensions are read from the first cluster; larger ones are refused. */
const MAX_HEADER_AREA = 64 * 1024;
const MAX_BACKING_NAME = 1023;

const EXT_END = 0;
const EXT_BACKING_FORMAT = 0xe2792aca;
const EXT_ENCRYPTION = 0x0537be77;
const EXT_DATA_FILE = 0x44415441;

/** Incompatible feature bits QEMU 7.2 writes for images forkd creates: compression type (3), extended L2 (4). */
const ALLOWED_INCOMPATIBLE = (1n << 3n) | (1n << 4n);

export interface Qcow2Header {
  version: 2 | 3;
  virtualSize: number;
  clusterBits: number;
  backingFile: string | null;
  /** From the backing-format header extension; null when the image leaves QEMU to probe it. */
  backingFormat: string | null;
  incompatibleFeatures: bigint;
  encrypted: boolean;
  internalSnapshots: number;
  /** Name of an external data file, if the image keeps its data outside itself. */
  dataFile: string | null;
}

/** Reads and sanity-checks a qcow2 header. Throws `unprocessable` naming `what` for anything that is not one. */
export async function readQcow2Header(file: string, what = file): Promise<Qcow2Header> {
  const handle = await open(file, "r");
  try {
    const { size } = await handle.stat();
    const area = Buffer.alloc(Math.min(size, MAX_HEADER_AREA));
    await handle.read(area, 0, area.length, 0);
    return parseQcow2Header(area, what);
  } finally {
    await handle.close();
  }
}

export function parseQcow2Header(area: Buffer, what: string): Qcow2Header {
  const bad = (why: string) => new ForkdError("unprocessable", `${what}: not a usable qcow2 image (${why})`);
  if (area.length < V2_HEADER_BYTES || area.readUInt32BE(0) !== QCOW2_MAGIC) throw bad("no qcow2 magic");
  const version = area.readUInt32BE(4);
  if (version !== 2 && version !== 3) throw bad(`version ${version}`);
  const backingOffset = area.readBigUInt64BE(8);
  const backingSize = area.readUInt32BE(16);
  const clusterBits = area.readUInt32BE(20);
  const virtualSize = area.readBigUInt64BE(24);
  const cryptMethod = area.readUInt32BE(32);
  const internalSnapshots = area.readUInt32BE(60);
  if (clusterBits < 9 || clusterBits > 21) throw bad(`cluster_bits ${clusterBits}`);
  if (virtualSize > BigInt(Number.MAX_SAFE_INTEGER)) throw bad("virtual size out of range");

  let incompatibleFeatures = 0n;
  let headerLength = V2_HEADER_BYTES;
  if (version === 3) {
    if (area.length < 104) throw bad("truncated v3 header");
    incompatibleFeatures = area.readBigUInt64BE(72);
    headerLength = area.readUInt32BE(100);
    if (headerLength < 104 || headerLength % 8 !== 0 || headerLength > area.length) {
      throw bad(`header length ${headerLength}`);
    }
  }

  let backingFile: string | null = null;
  if (backingOffset !== 0n) {
    const start = Number(backingOffset);
    if (backingSize === 0 || backingSize > MAX_BACKING_NAME || start + backingSize > area.length) {
      throw bad("backing file name out of bounds");
    }
    backingFile = area.subarray(start, start + backingSize).toString("utf8");
  }

  let backingFormat: string | null = null;
  let dataFile: string | null = null;
  let encrypted = cryptMethod !== 0;
  let at = headerLength;
  for (;;) {
    if (at + 8 > area.length) throw bad("header extensions run past the header area");
    const type = area.readUInt32BE(at);
    const length = area.readUInt32BE(at + 4);
    if (type === EXT_END) break;
    const body = at + 8;
    if (body + length > area.length) throw bad("header extension out of bounds");
    const data = area.subarray(body, body + length);
    if (type === EXT_BACKING_FORMAT) backingFormat = data.toString("utf8");
    else if (type === EXT_DATA_FILE) dataFile = data.toString("utf8");
    else if (type === EXT_ENCRYPTION) encrypted = true;
    // Others (feature names, bitmaps, unknown ones QEMU ignores) carry nothing forkd relies on.
    at = body + Math.ceil(length / 8) * 8;
  }
  if (backingFile?.includes("\0")) throw bad("NUL in backing file name");
  return {
    version,
    virtualSize: Number(virtualSize),
    clusterBits,
    backingFile,
    backingFormat,
    incompatibleFeatures,
    encrypted,
    internalSnapshots,
    dataFile,
  };
}

/**
 * Holds an imported disk layer to the shape forkd writes: backed by exactly `expected.backingFile` in
 * `expected.backingFormat`, self-contained otherwise. Anything else could make QEMU read an arbitrary host file.
 */
export function assertLayerShape(
  header: Qcow2Header,
  expected: { backingFile: string; backingFormat: "raw" | "qcow2" },
  what: string,
): void {
  const refuse = (why: string) => new ForkdError("unprocessable", `${what}: disk layer refused: ${why}`);
  if (header.dataFile !== null || (header.incompatibleFeatures & (1n << 2n)) !== 0n) {
    throw refuse("it uses an external data file");
  }
  if (header.encrypted) throw refuse("it is encrypted");
  if (header.internalSnapshots !== 0) throw refuse("it has internal snapshots");
  const unknown = header.incompatibleFeatures & ~ALLOWED_INCOMPATIBLE;
  if (unknown !== 0n) throw refuse(`incompatible feature bits 0x${unknown.toString(16)} (dirty or corrupt?)`);
  if (header.backingFile !== expected.backingFile) {
    throw refuse(
      `backing file is ${JSON.stringify(header.backingFile)}, expected ${JSON.stringify(expected.backingFile)}`,
    );
  }
  if (header.backingFormat !== expected.backingFormat) {
    throw refuse(
      `backing format is ${JSON.stringify(header.backingFormat)}, expected ${expected.backingFormat}`,
    );
  }
}
