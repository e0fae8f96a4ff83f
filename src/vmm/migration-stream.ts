/**
 * A streaming parser for the QEMU 7.2 migration stream that a `background-snapshot` migration writes (see
 * live-capture.ts). It hands the pages of one RAMBlock to a callback as they arrive and keeps the device
 * sections, which QEMU writes after all of RAM, as a device-state file a child loads with `-incoming fd:3` and
 * `-global migration.send-configuration=off` (the same format `xen-save-devices-state` writes).
 *
 * The format (QEMU migration/savevm.c and migration/ram.c, 7.2):
 *   be32 "QEVM" magic, be32 version 3
 *   [0x07 configuration: be32 len, machine name, subsections (0x05 ...)]          only if send-configuration
 *   sections, each followed by a footer (0x7e, be32 section id) when send-section-footer (default) is on:
 *     0x01 START / 0x04 FULL: be32 section id, u8 len, idstr, be32 instance id, be32 version id, payload
 *     0x02 PART  / 0x03 END : be32 section id, payload
 *   0x00 EOF [0x06 vmdescription JSON unless the machine has suppress-vmdesc=on]
 * RAM ("ram", an iterable section: START then PARTs) is a sequence of records, each a be64 `offset | flags`:
 *   MEM_SIZE (0x04): offset = total bytes; then per RAMBlock u8 len, idstr, be64 used length
 *                    (+ be64 address with x-ignore-shared)
 *   PAGE (0x08): [u8 len, idstr unless CONTINUE (0x20)] 4096 bytes      ZERO (0x02): [idstr] u8 fill byte
 *   EOS (0x10): end of this section's payload
 * In a background snapshot QEMU saves the device state while the VM is stopped but puts it in the stream
 * only after the last RAM section: FULL sections for every device, then EOF. Everything from the first FULL
 * section to the end is therefore the device state, in the same instant as the RAM.
 *
 * The stream is treated as untrusted input: every length and offset is bounds-checked, anything this parser
 * does not understand (compression, XBZRLE, postcopy commands, other iterable sections) is an error that
 * names what it found and where, and memory use is bounded.
 */
import { ForkdError } from "../common/errors.js";

export const QEMU_VM_FILE_MAGIC = 0x5145564d;
export const QEMU_VM_FILE_VERSION = 3;
/** x86 TARGET_PAGE_SIZE: the unit of every RAM record. */
export const GUEST_PAGE_SIZE = 4096;

const SECTION = {
  eof: 0x00,
  start: 0x01,
  part: 0x02,
  end: 0x03,
  full: 0x04,
  subsection: 0x05,
  vmdescription: 0x06,
  configuration: 0x07,
  command: 0x08,
  footer: 0x7e,
} as const;

const RAM_FLAG = {
  full: 0x01,
  zero: 0x02,
  memSize: 0x04,
  page: 0x08,
  eos: 0x10,
  continue: 0x20,
  xbzrle: 0x40,
  hook: 0x80,
  compressPage: 0x100,
} as const;

/** Bounds that no stream of ours comes near; they only stop a broken or hostile stream from growing memory. */
export const MAX_RAM_BLOCKS = 1024;
export const MAX_CAPABILITIES = 256;
/** The device part of a microvm guest is ~40-80 KB; anything this large is not a device state. */
export const DEFAULT_MAX_DEVICE_STATE_BYTES = 64 * 1024 * 1024;

/** Longest RAM record: be64 header + u8 len + 255-byte idstr + one page. */
const MAX_RAM_RECORD_BYTES = 8 + 1 + 255 + GUEST_PAGE_SIZE;

/** The idstr and instance of QEMU's "globalstate" section, which holds the run state saved with the devices. */
const GLOBAL_STATE_IDSTR = "globalstate";
/** GlobalState.runstate is char[100] in QEMU 7.2 (migration/global_state.c). */
const GLOBAL_STATE_RUNSTATE_BYTES = 100;

export class MigrationStreamError extends ForkdError {
  constructor(message: string, offset: number) {
    super("internal", `migration stream: ${message} (at byte ${offset})`);
    this.name = "MigrationStreamError";
  }
}

export interface RamBlockInfo {
  idstr: string;
  /** Used length in bytes. */
  length: number;
}

export interface MigrationStreamOptions {
  /** idstr of the RAMBlock whose pages are delivered (for a `memory-backend-file` with id "mem": "mem"). */
  ramBlock: string;
  /**
   * Called for every page record of `ramBlock`, in stream order, with the page index (offset / 4096). `data`
   * is a view valid only during the call (copy it to keep it). Zero records arrive as `zero: true` with a
   * page of the fill byte (always 0 in QEMU 7.2). A page can appear more than once; the last record wins,
   * as in QEMU's own loader.
   */
  onPage: (index: number, data: Buffer, zero: boolean) => void;
  /** Called once with the RAMBlock list of the setup section, before any page. */
  onRamBlocks?: (blocks: RamBlockInfo[]) => void;
  /** Default DEFAULT_MAX_DEVICE_STATE_BYTES. */
  maxDeviceStateBytes?: number;
}

export interface MigrationStreamResult {
  /** Header + device sections + EOF, without the configuration section: loadable with send-configuration=off. */
  deviceState: Buffer;
  /** The run state QEMU saved in its "globalstate" section (e.g. "paused" when the VM was stopped first). */
  savedRunState: string;
  /** Machine type named by the configuration section, if there was one (e.g. "microvm"). */
  machineType: string | undefined;
  ramBlocks: RamBlockInfo[];
  stats: {
    /** Bytes of the whole stream. */
    streamBytes: number;
    /** Page records of `ramBlock` with data / zero records, counting repeats. */
    pages: number;
    zeroPages: number;
    /** Records of `ramBlock` for a page that had already been sent. */
    repeatedPages: number;
    /** Page and zero records of other RAMBlocks (ROMs, firmware), skipped. */
    otherBlockRecords: number;
    ramSections: number;
  };
}

type State = "header" | "configuration" | "section" | "ram" | "footer" | "device" | "done";

class NeedMore extends Error {}
const NEED_MORE = new NeedMore("need more data");

/**
 * Push-based: `push()` every chunk as it arrives, then `finish()` at end of stream. Errors are thrown from
 * `push`/`finish` as MigrationStreamError; after an error the parser refuses further input.
 */
export class MigrationStreamParser {
  private readonly options: Required<Omit<MigrationStreamOptions, "onRamBlocks">> &
    Pick<MigrationStreamOptions, "onRamBlocks">;
  /** Unparsed input; queue[0] is read from `offset`. */
  private queue: Buffer[] = [];
  private offset = 0;
  /** Stream position of queue[0][offset], for error messages and stats. */
  private position = 0;
  private received = 0;
  private state: State = "header";
  private failed: Error | undefined;

  private ignoreShared = false;
  private machineType: string | undefined;
  private ramSectionId: number | undefined;
  private currentSectionId = 0;
  private blocks: RamBlockInfo[] = [];
  private blockByName = new Map<string, RamBlockInfo>();
  private lastBlock: RamBlockInfo | undefined;
  private target: RamBlockInfo | undefined;
  private seen: Uint8Array | undefined;
  private readonly fillPage = Buffer.alloc(GUEST_PAGE_SIZE);
  private fillByte = 0;
  private deviceChunks: Buffer[] = [];
  private deviceBytes = 0;
  private readonly stats: MigrationStreamResult["stats"] = {
    streamBytes: 0,
    pages: 0,
    zeroPages: 0,
    repeatedPages: 0,
    otherBlockRecords: 0,
    ramSections: 0,
  };

  constructor(options: MigrationStreamOptions) {
    if (!options.ramBlock || Buffer.byteLength(options.ramBlock) > 255) {
      throw new ForkdError("invalid_argument", "ramBlock must be a RAMBlock idstr of 1-255 bytes");
    }
    this.options = {
      ramBlock: options.ramBlock,
      onPage: options.onPage,
      onRamBlocks: options.onRamBlocks,
      maxDeviceStateBytes: options.maxDeviceStateBytes ?? DEFAULT_MAX_DEVICE_STATE_BYTES,
    };
  }

  push(chunk: Buffer): void {
    if (this.failed) throw this.failed;
    if (chunk.length === 0) return;
    this.received += chunk.length;
    if (this.state === "device") {
      this.addDeviceBytes(chunk);
      return;
    }
    if (this.state === "done") {
      this.fail("data after the end of the stream", this.received - chunk.length);
    }
    this.queue.push(chunk);
    try {
      this.parse();
    } catch (err) {
      this.failed = err as Error;
      throw err;
    }
  }

  /** Ends the stream: checks it was complete and returns the device state and statistics. */
  finish(): MigrationStreamResult {
    if (this.failed) throw this.failed;
    try {
      return this.complete();
    } catch (err) {
      this.failed = err as Error;
      throw err;
    }
  }

  private complete(): MigrationStreamResult {
    if (this.state !== "device") {
      const what =
        this.state === "header" || this.state === "configuration"
          ? "before its header was complete"
          : this.ramSectionId === undefined
            ? "before any RAM section"
            : "before the device state (the migration did not complete)";
      this.fail(`stream ended ${what}`, this.received);
    }
    const tail = this.deviceChunks[this.deviceChunks.length - 1] as Buffer;
    if (tail[tail.length - 1] !== SECTION.eof) {
      this.fail(
        `device state does not end with QEMU_VM_EOF (last byte 0x${(tail[tail.length - 1] ?? 0).toString(16)}); ` +
          "a trailing VM description means the machine lacks suppress-vmdesc=on",
        this.received - 1,
      );
    }
    if (!this.target) this.fail(`no RAMBlock named ${JSON.stringify(this.options.ramBlock)}`, this.received);
    const header = Buffer.alloc(8);
    header.writeUInt32BE(QEMU_VM_FILE_MAGIC, 0);
    header.writeUInt32BE(QEMU_VM_FILE_VERSION, 4);
    const deviceState = Buffer.concat([header, ...this.deviceChunks]);
    this.deviceChunks = [];
    this.state = "done";
    this.stats.streamBytes = this.received;
    return {
      deviceState,
      savedRunState: readGlobalRunState(deviceState).runState,
      machineType: this.machineType,
      ramBlocks: this.blocks,
      stats: { ...this.stats },
    };
  }

  private parse(): void {
    for (;;) {
      const head = this.queue[0];
      if (!head) return;
      const start = this.offset;
      let consumed: number;
      try {
        consumed = this.step(head, start);
      } catch (err) {
        if (err !== NEED_MORE) throw err;
        if (!this.mergeHead()) return;
        continue;
      }
      this.offset = consumed;
      this.position += consumed - start;
      if (this.offset >= head.length) {
        this.queue.shift();
        this.offset = 0;
      }
      if (this.state === "device") {
        // Everything from here on is device state: no more parsing, just bounded accumulation.
        const rest = this.queue;
        this.queue = [];
        if (rest[0]) rest[0] = rest[0].subarray(this.offset);
        this.offset = 0;
        for (const chunk of rest) this.addDeviceBytes(chunk);
        return;
      }
    }
  }

  /**
   * A record straddles queue[0] and queue[1]: move a bounded prefix of queue[1] behind the rest of queue[0],
   * so each chunk boundary costs a copy of a few KiB rather than of whole chunks. False if no more input.
   */
  private mergeHead(): boolean {
    const head = this.queue[0] as Buffer;
    const next = this.queue[1];
    if (!next) {
      if (this.offset > 0) {
        this.queue[0] = head.subarray(this.offset);
        this.offset = 0;
      }
      return false;
    }
    const rest = head.subarray(this.offset);
    // The configuration section has no fixed bound; merging whole chunks there is fine (it is tiny).
    const take = this.state === "ram" ? Math.min(next.length, MAX_RAM_RECORD_BYTES) : next.length;
    this.queue[0] = Buffer.concat([rest, next.subarray(0, take)]);
    this.offset = 0;
    if (take === next.length) this.queue.splice(1, 1);
    else this.queue[1] = next.subarray(take);
    return true;
  }

  /** Parses one unit at `buf[at]`; returns the offset after it, or throws NEED_MORE without side effects. */
  private step(buf: Buffer, at: number): number {
    switch (this.state) {
      case "header":
        return this.parseHeader(buf, at);
      case "configuration":
        return this.parseConfiguration(buf, at);
      case "section":
        return this.parseSectionStart(buf, at);
      case "ram":
        return this.parseRamRecord(buf, at);
      case "footer":
        return this.parseFooter(buf, at);
      default:
        return this.fail(`internal parser state ${this.state}`, this.position);
    }
  }

  private parseHeader(buf: Buffer, at: number): number {
    need(buf, at, 8);
    const magic = buf.readUInt32BE(at);
    if (magic !== QEMU_VM_FILE_MAGIC) {
      this.fail(
        `not a QEMU migration stream (magic 0x${magic.toString(16)}, expected "QEVM")`,
        this.position,
      );
    }
    const version = buf.readUInt32BE(at + 4);
    if (version !== QEMU_VM_FILE_VERSION) {
      this.fail(
        `unsupported stream version ${version} (expected ${QEMU_VM_FILE_VERSION})`,
        this.position + 4,
      );
    }
    this.state = "configuration";
    return at + 8;
  }

  private parseConfiguration(buf: Buffer, at: number): number {
    need(buf, at, 1);
    if (buf[at] !== SECTION.configuration) {
      this.state = "section";
      return at;
    }
    let p = at + 1;
    need(buf, p, 4);
    const nameLength = buf.readUInt32BE(p);
    p += 4;
    if (nameLength > 256) this.fail(`configuration: machine name of ${nameLength} bytes`, this.position + 1);
    need(buf, p, nameLength);
    const machineType = buf.toString("latin1", p, p + nameLength);
    p += nameLength;
    let ignoreShared = false;
    for (;;) {
      need(buf, p, 1);
      if (buf[p] !== SECTION.subsection) break;
      p += 1;
      const [name, afterName] = readIdstr(buf, p);
      p = afterName;
      need(buf, p, 4);
      p += 4; // subsection version
      if (name === "configuration/target-page-bits") {
        need(buf, p, 4);
        const bits = buf.readUInt32BE(p);
        if (bits !== 12) this.fail(`target page bits ${bits}; only 4 KiB pages are supported`, this.position);
        p += 4;
      } else if (name === "configuration/capabilities") {
        need(buf, p, 4);
        const count = buf.readUInt32BE(p);
        p += 4;
        if (count > MAX_CAPABILITIES) this.fail(`configuration: ${count} capabilities`, this.position);
        for (let i = 0; i < count; i++) {
          const [capability, next] = readIdstr(buf, p);
          p = next;
          if (capability === "x-ignore-shared") ignoreShared = true;
        }
      } else if (name === "configuration/uuid") {
        need(buf, p, 16);
        p += 16;
      } else {
        this.fail(`unknown configuration subsection ${JSON.stringify(name)}`, this.position);
      }
    }
    this.machineType = machineType;
    this.ignoreShared = ignoreShared;
    this.state = "section";
    return p;
  }

  private parseSectionStart(buf: Buffer, at: number): number {
    need(buf, at, 1);
    const type = buf[at] as number;
    switch (type) {
      case SECTION.start:
      case SECTION.full: {
        need(buf, at, 5);
        const sectionId = buf.readUInt32BE(at + 1);
        const [idstr, p] = readIdstr(buf, at + 5);
        need(buf, p, 8);
        if (type === SECTION.full) {
          if (this.ramSectionId === undefined) {
            this.fail(`device section ${JSON.stringify(idstr)} before any RAM section`, this.position);
          }
          // The device part begins here and runs to the end of the stream: kept byte for byte by parse().
          this.state = "device";
          return at;
        }
        if (idstr !== "ram") {
          this.fail(
            `unsupported iterable section ${JSON.stringify(idstr)} (only RAM is; block migration and ` +
              "dirty-bitmap migration must be off)",
            this.position,
          );
        }
        if (this.ramSectionId !== undefined) this.fail("a second RAM setup section", this.position);
        const version = buf.readUInt32BE(p + 4);
        if (version !== 4) this.fail(`RAM section version ${version} (expected 4)`, this.position);
        this.ramSectionId = sectionId;
        this.currentSectionId = sectionId;
        this.stats.ramSections++;
        this.state = "ram";
        return p + 8;
      }
      case SECTION.part:
      case SECTION.end: {
        need(buf, at, 5);
        const sectionId = buf.readUInt32BE(at + 1);
        if (sectionId !== this.ramSectionId) {
          this.fail(
            `continuation of section ${sectionId}, which is not the RAM section (${this.ramSectionId})`,
            this.position,
          );
        }
        this.currentSectionId = sectionId;
        this.stats.ramSections++;
        this.state = "ram";
        return at + 5;
      }
      case SECTION.eof:
        return this.fail("end of stream before the device state", this.position);
      case SECTION.command:
        return this.fail("a migration command (postcopy or return path); not supported", this.position);
      case SECTION.vmdescription:
        return this.fail("a VM description before the device state", this.position);
      case SECTION.configuration:
        return this.fail("a configuration section after the first section", this.position);
      default:
        return this.fail(`unknown section type 0x${type.toString(16)}`, this.position);
    }
  }

  private parseFooter(buf: Buffer, at: number): number {
    need(buf, at, 1);
    if (buf[at] !== SECTION.footer) {
      // Footers are optional (send-section-footer=off).
      this.state = "section";
      return at;
    }
    need(buf, at, 5);
    const sectionId = buf.readUInt32BE(at + 1);
    if (sectionId !== this.currentSectionId) {
      this.fail(`section footer for ${sectionId} closes section ${this.currentSectionId}`, this.position);
    }
    this.state = "section";
    return at + 5;
  }

  private parseRamRecord(buf: Buffer, at: number): number {
    need(buf, at, 8);
    const high = buf.readUInt32BE(at);
    const low = buf.readUInt32BE(at + 4);
    const flags = low & (GUEST_PAGE_SIZE - 1);
    // Offsets stay below 2^53 for any RAM a host can have: exact as a double.
    const offset = high * 0x1_0000_0000 + (low - flags);
    let p = at + 8;

    if (flags === RAM_FLAG.eos) {
      this.state = "footer";
      return p;
    }
    if (flags === RAM_FLAG.memSize) {
      if (this.blocks.length > 0) this.fail("a second RAM block list", this.position);
      return this.parseBlockList(buf, p, offset);
    }
    const kind = flags & ~RAM_FLAG.continue;
    if (kind !== RAM_FLAG.page && kind !== RAM_FLAG.zero) {
      return this.fail(
        `RAM record flags 0x${flags.toString(16)} (compression, XBZRLE and RDMA hooks are not supported)`,
        this.position,
      );
    }
    let block: RamBlockInfo | undefined;
    if (flags & RAM_FLAG.continue) {
      block = this.lastBlock;
      if (!block) this.fail("RAM record continues a block, but no block was named yet", this.position);
    } else {
      const [idstr, next] = readIdstr(buf, p);
      p = next;
      block = this.blockByName.get(idstr);
      if (!block) this.fail(`RAM record for unknown block ${JSON.stringify(idstr)}`, this.position);
    }
    const payload = kind === RAM_FLAG.page ? GUEST_PAGE_SIZE : 1;
    need(buf, p, payload);
    if (offset + GUEST_PAGE_SIZE > block.length) {
      this.fail(
        `page at offset ${offset} is outside block ${JSON.stringify(block.idstr)} (${block.length} bytes)`,
        this.position,
      );
    }
    // All checks passed and the whole record is present: from here on there are side effects.
    this.lastBlock = block;
    if (block !== this.target) {
      this.stats.otherBlockRecords++;
      return p + payload;
    }
    const index = offset / GUEST_PAGE_SIZE;
    const seen = this.seen as Uint8Array;
    if (seen[index]) this.stats.repeatedPages++;
    seen[index] = 1;
    if (kind === RAM_FLAG.page) {
      this.stats.pages++;
      this.options.onPage(index, buf.subarray(p, p + GUEST_PAGE_SIZE), false);
    } else {
      this.stats.zeroPages++;
      const fill = buf[p] as number;
      if (fill !== this.fillByte) {
        this.fillPage.fill(fill);
        this.fillByte = fill;
      }
      this.options.onPage(index, this.fillPage, true);
    }
    return p + payload;
  }

  private parseBlockList(buf: Buffer, at: number, total: number): number {
    const blocks: RamBlockInfo[] = [];
    let remaining = total;
    let p = at;
    while (remaining > 0) {
      if (blocks.length >= MAX_RAM_BLOCKS) this.fail(`more than ${MAX_RAM_BLOCKS} RAM blocks`, this.position);
      const [idstr, next] = readIdstr(buf, p);
      p = next;
      need(buf, p, this.ignoreShared ? 16 : 8);
      const length = readBe64(buf, p);
      p += this.ignoreShared ? 16 : 8;
      if (length <= 0 || length > remaining || length % GUEST_PAGE_SIZE !== 0) {
        this.fail(
          `RAM block ${JSON.stringify(idstr)} has length ${length} (remaining total ${remaining})`,
          this.position,
        );
      }
      if (blocks.some((b) => b.idstr === idstr)) {
        this.fail(`RAM block ${JSON.stringify(idstr)} listed twice`, this.position);
      }
      blocks.push({ idstr, length });
      remaining -= length;
    }
    this.blocks = blocks;
    this.blockByName = new Map(blocks.map((b) => [b.idstr, b]));
    this.target = this.blockByName.get(this.options.ramBlock);
    if (!this.target) {
      this.fail(
        `no RAM block ${JSON.stringify(this.options.ramBlock)} in the stream (blocks: ` +
          `${blocks.map((b) => b.idstr).join(", ")})`,
        this.position,
      );
    }
    this.seen = new Uint8Array(this.target.length / GUEST_PAGE_SIZE);
    this.options.onRamBlocks?.(blocks);
    return p;
  }

  private addDeviceBytes(chunk: Buffer): void {
    if (chunk.length === 0) return;
    this.deviceBytes += chunk.length;
    if (this.deviceBytes > this.options.maxDeviceStateBytes) {
      this.failed = new MigrationStreamError(
        `device state larger than ${this.options.maxDeviceStateBytes} bytes`,
        this.received,
      );
      throw this.failed;
    }
    this.deviceChunks.push(chunk);
  }

  private fail(message: string, offset: number): never {
    throw new MigrationStreamError(message, offset);
  }
}

function need(buf: Buffer, at: number, n: number): void {
  if (at + n > buf.length) throw NEED_MORE;
}

/** u8 length + bytes (QEMU's idstr encoding); the name must be non-empty printable ASCII. */
function readIdstr(buf: Buffer, at: number): [string, number] {
  need(buf, at, 1);
  const length = buf[at] as number;
  need(buf, at + 1, length);
  const end = at + 1 + length;
  for (let i = at + 1; i < end; i++) {
    const c = buf[i] as number;
    if (c < 0x20 || c > 0x7e) throw new MigrationStreamError("a name with non-printable bytes", at);
  }
  if (length === 0) throw new MigrationStreamError("an empty name", at);
  return [buf.toString("latin1", at + 1, end), end];
}

function readBe64(buf: Buffer, at: number): number {
  const value = buf.readBigUInt64BE(at);
  if (value > BigInt(Number.MAX_SAFE_INTEGER)) throw new MigrationStreamError(`64-bit value ${value}`, at);
  return Number(value);
}

export interface GlobalRunState {
  runState: string;
  /** Offset of the 100-byte runstate buffer inside the device-state buffer. */
  bufferOffset: number;
  /** Offset of the be32 size field (strlen + 1) before it. */
  sizeOffset: number;
}

/**
 * Finds QEMU's "globalstate" section in a device-state buffer (as written by xen-save-devices-state or taken
 * from a migration stream) and reads the run state saved in it. The section is found by its header and
 * checked field by field (size, NUL-terminated name, footer), so a look-alike inside another device's data
 * does not match.
 */
export function readGlobalRunState(deviceState: Buffer): GlobalRunState {
  const idstr = Buffer.from(GLOBAL_STATE_IDSTR, "latin1");
  let found: GlobalRunState | undefined;
  for (let i = deviceState.indexOf(idstr); i >= 0; i = deviceState.indexOf(idstr, i + 1)) {
    const header = i - 6; // type, be32 section id, u8 length
    if (header < 8 || deviceState[header] !== SECTION.full || deviceState[i - 1] !== idstr.length) continue;
    const sectionId = deviceState.readUInt32BE(header + 1);
    const fields = i + idstr.length + 8; // instance id, version id
    const footer = fields + 4 + GLOBAL_STATE_RUNSTATE_BYTES;
    if (footer + 5 > deviceState.length) continue;
    if (deviceState[footer] !== SECTION.footer || deviceState.readUInt32BE(footer + 1) !== sectionId)
      continue;
    const size = deviceState.readUInt32BE(fields);
    if (size < 1 || size > GLOBAL_STATE_RUNSTATE_BYTES) continue;
    const text = deviceState.subarray(fields + 4, fields + 4 + size);
    if (text[size - 1] !== 0 || !/^[a-z-]+$/.test(text.toString("latin1", 0, size - 1))) continue;
    if (found) throw new MigrationStreamError("two globalstate sections", i);
    found = {
      runState: text.toString("latin1", 0, size - 1),
      bufferOffset: fields + 4,
      sizeOffset: fields,
    };
  }
  if (!found) throw new MigrationStreamError("no globalstate section in the device state", 0);
  return found;
}

/**
 * Rewrites the run state saved in a device-state buffer in place (same length). A child loading a state saved
 * as "paused" stays paused after the load (QEMU's process_incoming_migration_bh); "running" makes it run by
 * itself unless started with -S, as children of `xen-save-devices-state` snapshots do (that command always
 * saves "running").
 */
export function setGlobalRunState(deviceState: Buffer, runState: "running" | "paused"): void {
  const { bufferOffset, sizeOffset } = readGlobalRunState(deviceState);
  deviceState.fill(0, bufferOffset, bufferOffset + GLOBAL_STATE_RUNSTATE_BYTES);
  deviceState.write(runState, bufferOffset, "latin1");
  deviceState.writeUInt32BE(runState.length + 1, sizeOffset);
}
