/**
 * The guest RAM of a snapshot chain's head, read page by page the way a sandbox that maps the RAM image of one of
 * its layers sees it: the layers above that one (newest first; a flat one has every page), then the image. A
 * BRANCH or a pause compares the pages a sandbox wrote against it, so a new layer stores only what changed.
 *
 * Reads are grouped into runs (consecutive pages from the same file in one pread), because a sandbox's private
 * pages number in the tens of thousands and one read per page costs more than the copy out of the VM.
 */
import { closeSync, openSync, readSync } from "node:fs";
import path from "node:path";
import { ForkdError } from "../../common/errors.js";
import { PAGE_SIZE, readLayerIndex } from "../../store/memory-layer.js";
import type { StoredSnapshot } from "../../store/snapshot-store.js";
import { SNAPSHOT_FILES } from "../machines/machine.js";

interface LayerSource {
  fd: number;
  pages: Uint32Array;
  dataOffset: number;
}

export class ChainRam {
  private constructor(
    /** Newest first. */
    private readonly layers: LayerSource[],
    private readonly baseFd: number,
  ) {}

  /**
   * `chain` root first; `memoryTag` the layer whose RAM image `memoryImage` is (everything above it comes from
   * the layers' own files).
   */
  static async open(chain: StoredSnapshot[], memoryTag: string, memoryImage: string): Promise<ChainRam> {
    const at = chain.findIndex((s) => s.tag === memoryTag);
    const layers: LayerSource[] = [];
    let base = memoryImage;
    try {
      for (const snapshot of chain.slice(at + 1).reverse()) {
        if (snapshot.manifest.memory.format === "flat") {
          base = path.join(snapshot.dir, SNAPSHOT_FILES.memory);
          break;
        }
        const file = path.join(snapshot.dir, SNAPSHOT_FILES.memoryLayer);
        const { pages, dataOffset } = await readLayerIndex(file);
        layers.push({ fd: openSync(file, "r"), pages, dataOffset });
      }
      return new ChainRam(layers, openSync(base, "r"));
    } catch (err) {
      for (const layer of layers) closeSync(layer.fd);
      throw err;
    }
  }

  /** Fills `out` with the content of `pages` (ascending page numbers), `PAGE_SIZE` bytes each. */
  read(pages: Uint32Array, out: Buffer): void {
    if (out.length < pages.length * PAGE_SIZE)
      throw new ForkdError("internal", "ChainRam.read: buffer too small");
    let i = 0;
    while (i < pages.length) {
      const { fd, position, step } = this.locate(pages[i] as number);
      // Extend the run while the next page sits right after this one in the same file.
      let j = i + 1;
      while (j < pages.length) {
        const next = this.locate(pages[j] as number);
        if (next.fd !== fd || next.position !== position + (j - i) * PAGE_SIZE || next.step !== step) break;
        j++;
      }
      readFully(fd, out, i * PAGE_SIZE, (j - i) * PAGE_SIZE, position);
      i = j;
    }
  }

  close(): void {
    for (const layer of this.layers) closeSync(layer.fd);
    closeSync(this.baseFd);
  }

  /** Where page `page` is read from: the newest layer holding it, else the image. */
  private locate(page: number): { fd: number; position: number; step: number } {
    for (let l = 0; l < this.layers.length; l++) {
      const layer = this.layers[l] as LayerSource;
      const slot = slotOf(layer.pages, page);
      if (slot >= 0) return { fd: layer.fd, position: layer.dataOffset + slot * PAGE_SIZE, step: l };
    }
    return { fd: this.baseFd, position: page * PAGE_SIZE, step: -1 };
  }
}

/** Pages compared per read of the chain (4 MiB): a bounded scratch buffer instead of a copy of every page. */
const COMPARE_BATCH_PAGES = 1024;

/**
 * Keeps the pages that differ from the chain's RAM, packed in place: `captured.data` is consumed (the result's
 * data is a view of its start).
 */
export async function changedAgainstChain(
  chain: StoredSnapshot[],
  memoryTag: string,
  memoryImage: string,
  captured: { pages: Uint32Array; data: Buffer },
): Promise<{ pages: Uint32Array; data: Buffer }> {
  return packInPlace(captured, await changedIndices(chain, memoryTag, memoryImage, captured));
}

/**
 * Which of the captured pages (indices into `captured.pages`, ascending) differ from the chain's RAM. The chain's
 * content is read batch by batch into one reused scratch buffer (a buffer the size of the capture would cost a
 * page fault per page on top of the copy).
 */
export async function changedIndices(
  chain: StoredSnapshot[],
  memoryTag: string,
  memoryImage: string,
  captured: { pages: Uint32Array; data: Buffer },
): Promise<Uint32Array> {
  const ram = await ChainRam.open(chain, memoryTag, memoryImage);
  try {
    const { pages, data } = captured;
    const scratch = Buffer.allocUnsafe(Math.min(pages.length, COMPARE_BATCH_PAGES) * PAGE_SIZE);
    const changed = new Uint32Array(pages.length);
    let count = 0;
    for (let first = 0; first < pages.length; first += COMPARE_BATCH_PAGES) {
      const batch = pages.subarray(first, Math.min(pages.length, first + COMPARE_BATCH_PAGES));
      ram.read(batch, scratch);
      for (let k = 0; k < batch.length; k++) {
        const from = (first + k) * PAGE_SIZE;
        if (data.compare(scratch, k * PAGE_SIZE, (k + 1) * PAGE_SIZE, from, from + PAGE_SIZE) !== 0) {
          changed[count++] = first + k;
        }
      }
    }
    return changed.subarray(0, count);
  } finally {
    ram.close();
  }
}

/**
 * The pages of `captured` at the indices `keep` (ascending), packed at the start of its own buffer (one move per
 * run of kept pages; nothing is allocated). `captured.data` is consumed.
 */
export function packInPlace(
  captured: { pages: Uint32Array; data: Buffer },
  keep: Uint32Array,
): { pages: Uint32Array; data: Buffer } {
  const { pages, data } = captured;
  if (keep.length === pages.length) return { pages, data };
  const keptPages = new Uint32Array(keep.length);
  let i = 0;
  while (i < keep.length) {
    // A run of consecutive kept indices moves with one copyWithin (memmove: the regions may overlap).
    let j = i + 1;
    while (j < keep.length && keep[j] === (keep[j - 1] as number) + 1) j++;
    const from = keep[i] as number;
    if (from !== i) data.copyWithin(i * PAGE_SIZE, from * PAGE_SIZE, (from + j - i) * PAGE_SIZE);
    for (let k = i; k < j; k++) keptPages[k] = pages[keep[k] as number] as number;
    i = j;
  }
  return { pages: keptPages, data: data.subarray(0, keep.length * PAGE_SIZE) };
}

function slotOf(pages: Uint32Array, page: number): number {
  let lo = 0;
  let hi = pages.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >>> 1;
    const at = pages[mid] as number;
    if (at === page) return mid;
    if (at < page) lo = mid + 1;
    else hi = mid - 1;
  }
  return -1;
}

function readFully(fd: number, into: Buffer, offset: number, length: number, position: number): void {
  let done = 0;
  while (done < length) {
    const n = readSync(fd, into, offset + done, length - done, position + done);
    if (n === 0) throw new ForkdError("unprocessable", `RAM image ends before offset ${position + done}`);
    done += n;
  }
}
