/**
 * A memory diff layer: the guest pages a snapshot changed relative to its parent, and nothing else, in a plain
 * file that works on any filesystem (no reflinks, no reliance on sparse files):
 *
 *   offset 0   magic "FKDMEML1" (8 bytes)
 *   8          u32 LE page size (4096)
 *   12         u32 LE page count N
 *   16         u64 LE guest RAM size in bytes (the layer only applies to a RAM of exactly this size)
 *   24         N x u32 LE page numbers, strictly increasing
 *   24 + 4N    N pages of page-size bytes, in the same order
 *
 * Integrity: the manifest records the file's sha256, like every snapshot file.
 */
import { createHash } from "node:crypto";
import { type FileHandle, open } from "node:fs/promises";
import { ForkdError } from "../common/errors.js";

export const LAYER_MAGIC = Buffer.from("FKDMEML1", "ascii");
export const PAGE_SIZE = 4096;
const HEADER_BYTES = 24;
/** Pages copied per read/write when applying a layer (4 MiB). */
const APPLY_BATCH_PAGES = 1024;

export interface LayerHeader {
  pageCount: number;
  ramBytes: number;
}

/** Writes a layer from sorted page numbers and their contents (`data` holds the pages in the same order). */
export async function writeMemoryLayer(
  file: string,
  ramBytes: number,
  pages: Uint32Array,
  data: Buffer,
): Promise<number> {
  return (await writeMemoryLayerHashed(file, ramBytes, pages, data)).size;
}

/**
 * `writeMemoryLayer`, hashing the bytes as they are written (a layer of 100 MiB is not read back to be hashed:
 * the snapshot writer takes the digest).
 */
export async function writeMemoryLayerHashed(
  file: string,
  ramBytes: number,
  pages: Uint32Array,
  data: Buffer,
): Promise<{ size: number; sha256: string }> {
  if (data.length !== pages.length * PAGE_SIZE) {
    throw new ForkdError("internal", `memory layer: ${pages.length} pages but ${data.length} bytes of data`);
  }
  for (let i = 1; i < pages.length; i++) {
    if ((pages[i] as number) <= (pages[i - 1] as number)) {
      throw new ForkdError("internal", "memory layer: page numbers must be strictly increasing");
    }
  }
  const header = Buffer.alloc(HEADER_BYTES);
  LAYER_MAGIC.copy(header, 0);
  header.writeUInt32LE(PAGE_SIZE, 8);
  header.writeUInt32LE(pages.length, 12);
  header.writeBigUInt64LE(BigInt(ramBytes), 16);
  const index = Buffer.from(pages.buffer, pages.byteOffset, pages.byteLength);
  const handle = await open(file, "wx", 0o600);
  let sha256: string;
  try {
    // The write runs on libuv's threads while this one hashes the same bytes (the buffers are not changed).
    const written = handle.writev([header, index, data]);
    sha256 = createHash("sha256").update(header).update(index).update(data).digest("hex");
    await written;
    await handle.datasync();
  } finally {
    await handle.close();
  }
  return { size: HEADER_BYTES + index.length + data.length, sha256 };
}

/** Reads and validates a layer's header and page index (not its pages). Hostile input fails cleanly. */
export async function readLayerIndex(
  file: string,
): Promise<{ header: LayerHeader; pages: Uint32Array; dataOffset: number }> {
  const handle = await open(file, "r");
  try {
    const { size } = await handle.stat();
    const head = Buffer.alloc(HEADER_BYTES);
    const { bytesRead } = await handle.read(head, 0, HEADER_BYTES, 0);
    if (bytesRead !== HEADER_BYTES || !head.subarray(0, 8).equals(LAYER_MAGIC)) {
      throw new ForkdError("unprocessable", `${file}: not a forkd memory layer`);
    }
    const pageSize = head.readUInt32LE(8);
    const pageCount = head.readUInt32LE(12);
    const ramBytes = Number(head.readBigUInt64LE(16));
    if (pageSize !== PAGE_SIZE)
      throw new ForkdError("unprocessable", `${file}: page size ${pageSize} unsupported`);
    const dataOffset = HEADER_BYTES + pageCount * 4;
    if (size !== dataOffset + pageCount * PAGE_SIZE || ramBytes % PAGE_SIZE !== 0) {
      throw new ForkdError("unprocessable", `${file}: truncated or inconsistent memory layer`);
    }
    const indexBytes = Buffer.alloc(pageCount * 4);
    await handle.read(indexBytes, 0, indexBytes.length, HEADER_BYTES);
    const pages = new Uint32Array(pageCount);
    const ramPages = ramBytes / PAGE_SIZE;
    for (let i = 0; i < pageCount; i++) {
      const page = indexBytes.readUInt32LE(i * 4);
      if (page >= ramPages || (i > 0 && page <= (pages[i - 1] as number))) {
        throw new ForkdError("unprocessable", `${file}: page index is out of range or not increasing`);
      }
      pages[i] = page;
    }
    return { header: { pageCount, ramBytes }, pages, dataOffset };
  } finally {
    await handle.close();
  }
}

/**
 * Writes pages (packed in `data` in the order of `pages`, ascending page numbers) into an open RAM image at
 * their offsets, one write per run of consecutive pages.
 */
export async function writePagesAt(image: FileHandle, pages: Uint32Array, data: Buffer): Promise<void> {
  let i = 0;
  while (i < pages.length) {
    let j = i;
    while (j + 1 < pages.length && pages[j + 1] === (pages[j] as number) + 1) j++;
    await image.write(data, i * PAGE_SIZE, (j - i + 1) * PAGE_SIZE, (pages[i] as number) * PAGE_SIZE);
    i = j + 1;
  }
}

/** Writes a layer's pages into `target` (a flat RAM image of the layer's RAM size) at their offsets. */
export async function applyMemoryLayer(layerFile: string, target: string): Promise<LayerHeader> {
  const { header, pages, dataOffset } = await readLayerIndex(layerFile);
  const source = await open(layerFile, "r");
  const sink = await open(target, "r+");
  try {
    const { size } = await sink.stat();
    if (size !== header.ramBytes) {
      throw new ForkdError(
        "unprocessable",
        `${layerFile}: layer is for ${header.ramBytes} bytes of RAM, image has ${size}`,
      );
    }
    const buffer = Buffer.allocUnsafe(APPLY_BATCH_PAGES * PAGE_SIZE);
    for (let first = 0; first < pages.length; first += APPLY_BATCH_PAGES) {
      const count = Math.min(APPLY_BATCH_PAGES, pages.length - first);
      await source.read(buffer, 0, count * PAGE_SIZE, dataOffset + first * PAGE_SIZE);
      // Write runs of consecutive pages with one call each.
      let i = 0;
      while (i < count) {
        let j = i;
        while (j + 1 < count && pages[first + j + 1] === (pages[first + j] as number) + 1) j++;
        await sink.write(
          buffer,
          i * PAGE_SIZE,
          (j - i + 1) * PAGE_SIZE,
          (pages[first + i] as number) * PAGE_SIZE,
        );
        i = j + 1;
      }
    }
    await sink.sync();
    return header;
  } finally {
    await source.close();
    await sink.close();
  }
}

/** Random access to a layer's pages by page number (the index is loaded; pages are read on demand). */
export class LayerReader {
  private constructor(
    private readonly handle: FileHandle,
    private readonly pages: Uint32Array,
    private readonly dataOffset: number,
  ) {}

  static async open(file: string): Promise<LayerReader> {
    const { pages, dataOffset } = await readLayerIndex(file);
    return new LayerReader(await open(file, "r"), pages, dataOffset);
  }

  /** Slot of `page` in the layer, or -1 (binary search: the index is strictly increasing). */
  slotOf(page: number): number {
    let lo = 0;
    let hi = this.pages.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >>> 1;
      const at = this.pages[mid] as number;
      if (at === page) return mid;
      if (at < page) lo = mid + 1;
      else hi = mid - 1;
    }
    return -1;
  }

  async readSlot(slot: number, into: Buffer, offset = 0): Promise<void> {
    await this.handle.read(into, offset, PAGE_SIZE, this.dataOffset + slot * PAGE_SIZE);
  }

  close(): Promise<void> {
    return this.handle.close();
  }
}

/**
 * Keeps only the pages whose content differs from what the parent already has. `parentPage` fills `into` with the
 * parent's content of a page. Returns the kept pages (still sorted) and their data, packed.
 */
export async function keepChangedPages(
  pages: Uint32Array,
  data: Buffer,
  parentPage: (page: number, into: Buffer) => Promise<void>,
): Promise<{ pages: Uint32Array; data: Buffer }> {
  const keep: number[] = [];
  const scratch = Buffer.allocUnsafe(PAGE_SIZE);
  for (let i = 0; i < pages.length; i++) {
    await parentPage(pages[i] as number, scratch);
    if (!scratch.equals(data.subarray(i * PAGE_SIZE, (i + 1) * PAGE_SIZE))) keep.push(i);
  }
  if (keep.length === pages.length) return { pages, data };
  const keptPages = new Uint32Array(keep.length);
  const keptData = Buffer.allocUnsafe(keep.length * PAGE_SIZE);
  keep.forEach((from, to) => {
    keptPages[to] = pages[from] as number;
    data.copy(keptData, to * PAGE_SIZE, from * PAGE_SIZE, (from + 1) * PAGE_SIZE);
  });
  return { pages: keptPages, data: keptData };
}
