/**
 * The migration-stream parser on synthetic streams built here byte by byte in QEMU 7.2's format (the real
 * streams are checked in branch-live.test.ts): what it delivers, how chunking cannot change the result, and
 * that every kind of malformed input fails with an error saying what was wrong.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import {
  GUEST_PAGE_SIZE,
  MigrationStreamError,
  MigrationStreamParser,
  type MigrationStreamResult,
  readGlobalRunState,
  setGlobalRunState,
} from "../../src/vmm/migration-stream.js";

/** Writes a stream the way QEMU's savevm.c/ram.c do. */
class StreamWriter {
  private parts: Buffer[] = [];

  u8(v: number): this {
    this.parts.push(Buffer.from([v]));
    return this;
  }
  be32(v: number): this {
    const b = Buffer.alloc(4);
    b.writeUInt32BE(v);
    this.parts.push(b);
    return this;
  }
  be64(v: number): this {
    const b = Buffer.alloc(8);
    b.writeBigUInt64BE(BigInt(v));
    this.parts.push(b);
    return this;
  }
  idstr(s: string): this {
    this.u8(s.length);
    this.parts.push(Buffer.from(s, "latin1"));
    return this;
  }
  bytes(b: Buffer): this {
    this.parts.push(b);
    return this;
  }
  header(): this {
    return this.be32(0x5145564d).be32(3);
  }
  configuration(machine = "microvm", capabilities: string[] = []): this {
    this.u8(0x07).be32(machine.length).bytes(Buffer.from(machine));
    if (capabilities.length > 0) {
      this.u8(0x05).idstr("configuration/capabilities").be32(1).be32(capabilities.length);
      for (const c of capabilities) this.idstr(c);
    }
    return this;
  }
  sectionStart(type: 1 | 4, id: number, idstr: string, version: number): this {
    return this.u8(type).be32(id).idstr(idstr).be32(0).be32(version);
  }
  sectionPart(id: number): this {
    return this.u8(0x02).be32(id);
  }
  footer(id: number): this {
    return this.u8(0x7e).be32(id);
  }
  ramBlocks(blocks: [string, number][]): this {
    this.be64(blocks.reduce((n, [, len]) => n + len, 0) | 0x04);
    for (const [name, len] of blocks) this.idstr(name).be64(len);
    return this;
  }
  page(block: string | undefined, offset: number, fill: number): this {
    this.be64(offset | 0x08 | (block === undefined ? 0x20 : 0));
    if (block !== undefined) this.idstr(block);
    return this.bytes(Buffer.alloc(GUEST_PAGE_SIZE, fill));
  }
  zero(block: string | undefined, offset: number): this {
    this.be64(offset | 0x02 | (block === undefined ? 0x20 : 0));
    if (block !== undefined) this.idstr(block);
    return this.u8(0);
  }
  eos(): this {
    return this.be64(0x10);
  }
  globalState(id: number, runState: string): this {
    const buffer = Buffer.alloc(100);
    buffer.write(runState, "latin1");
    return this.sectionStart(4, id, "globalstate", 1)
      .be32(runState.length + 1)
      .bytes(buffer)
      .footer(id);
  }
  build(): Buffer {
    return Buffer.concat(this.parts);
  }
}

const MEM = 16 * GUEST_PAGE_SIZE;

/** A stream like a background snapshot's: config, RAM setup, two RAM parts, device sections, EOF. */
function sampleStream(): { stream: Buffer; devicePart: Buffer } {
  const w = new StreamWriter().header().configuration();
  w.sectionStart(1, 2, "ram", 4)
    .ramBlocks([
      ["mem", MEM],
      ["pc.bios", 2 * GUEST_PAGE_SIZE],
    ])
    .eos()
    .footer(2);
  w.sectionPart(2)
    .page("mem", 0, 0xa0)
    .page(undefined, GUEST_PAGE_SIZE, 0xa1)
    .zero(undefined, 2 * GUEST_PAGE_SIZE)
    .page("pc.bios", 0, 0xb0)
    .eos()
    .footer(2);
  w.sectionPart(2)
    .page("mem", 5 * GUEST_PAGE_SIZE, 0xa5)
    .page("mem", GUEST_PAGE_SIZE, 0xc1) // sent again: the later one wins
    .eos()
    .footer(2);
  const device = new StreamWriter()
    .sectionStart(4, 3, "timer", 2)
    .bytes(Buffer.from("device-bytes"))
    .footer(3)
    .globalState(19, "paused")
    .u8(0x00)
    .build();
  w.bytes(device);
  return { stream: w.build(), devicePart: device };
}

function parse(
  stream: Buffer,
  chunkSize: number,
): { result: MigrationStreamResult; pages: [number, number, boolean][] } {
  const pages: [number, number, boolean][] = [];
  const parser = new MigrationStreamParser({
    ramBlock: "mem",
    onPage: (index, data, zero) => {
      assert.equal(data.length, GUEST_PAGE_SIZE);
      assert.ok(data.every((b) => b === data[0]));
      pages.push([index, data[0] as number, zero]);
    },
  });
  for (let i = 0; i < stream.length; i += chunkSize) parser.push(stream.subarray(i, i + chunkSize));
  return { result: parser.finish(), pages };
}

function expectStreamError(stream: Buffer, pattern: RegExp): void {
  assert.throws(
    () => parse(stream, 4096),
    (err: unknown) => err instanceof MigrationStreamError && pattern.test(err.message),
  );
}

describe("migration stream parser", () => {
  test("delivers the pages of the named block, keeps the device part and reads the saved run state", () => {
    const { stream, devicePart } = sampleStream();
    const { result, pages } = parse(stream, 65536);
    assert.deepEqual(pages, [
      [0, 0xa0, false],
      [1, 0xa1, false],
      [2, 0, true],
      [5, 0xa5, false],
      [1, 0xc1, false],
    ]);
    assert.equal(result.machineType, "microvm");
    assert.equal(result.savedRunState, "paused");
    assert.deepEqual(
      result.ramBlocks.map((b) => b.idstr),
      ["mem", "pc.bios"],
    );
    assert.equal(result.stats.pages, 4);
    assert.equal(result.stats.zeroPages, 1);
    assert.equal(result.stats.repeatedPages, 1);
    assert.equal(result.stats.otherBlockRecords, 1);
    assert.equal(result.stats.streamBytes, stream.length);
    // header (no configuration) + the device part byte for byte
    assert.deepEqual(result.deviceState.subarray(0, 8), Buffer.from("QEVM\0\0\0\x03", "latin1"));
    assert.deepEqual(result.deviceState.subarray(8), devicePart);
  });

  test("any chunking gives the same result", () => {
    const { stream } = sampleStream();
    const reference = parse(stream, stream.length);
    for (const size of [1, 2, 3, 7, 8, 9, 63, 4095, 4096, 4097, 4105, 5000]) {
      const { result, pages } = parse(stream, size);
      assert.deepEqual(pages, reference.pages, `chunk size ${size}`);
      assert.deepEqual(result.deviceState, reference.result.deviceState, `chunk size ${size}`);
    }
  });

  test("the run state can be rewritten in place, keeping the length", () => {
    const { stream } = sampleStream();
    const { deviceState } = parse(stream, 4096).result;
    const length = deviceState.length;
    setGlobalRunState(deviceState, "running");
    assert.equal(deviceState.length, length);
    assert.equal(readGlobalRunState(deviceState).runState, "running");
    setGlobalRunState(deviceState, "paused");
    assert.equal(readGlobalRunState(deviceState).runState, "paused");
    assert.throws(() => readGlobalRunState(Buffer.from("QEVM\0\0\0\x03\0", "latin1")), /no globalstate/);
  });

  test("x-ignore-shared in the configuration adds an address to every block entry", () => {
    const w = new StreamWriter().header().configuration("microvm", ["x-ignore-shared"]);
    w.sectionStart(1, 2, "ram", 4);
    w.be64(MEM | 0x04)
      .idstr("mem")
      .be64(MEM)
      .be64(0);
    w.eos()
      .footer(2)
      .sectionPart(2)
      .page("mem", 3 * GUEST_PAGE_SIZE, 7)
      .eos()
      .footer(2);
    w.globalState(4, "running").u8(0);
    const { result, pages } = parse(w.build(), 100);
    assert.deepEqual(pages, [[3, 7, false]]);
    assert.equal(result.savedRunState, "running");
  });

  test("malformed streams fail with an error naming the problem", () => {
    const setup = () =>
      new StreamWriter()
        .header()
        .configuration()
        .sectionStart(1, 2, "ram", 4)
        .ramBlocks([["mem", MEM]])
        .eos()
        .footer(2);
    expectStreamError(Buffer.from("NOTQEMU!", "latin1"), /not a QEMU migration stream/);
    expectStreamError(new StreamWriter().be32(0x5145564d).be32(2).build(), /unsupported stream version 2/);
    expectStreamError(new StreamWriter().header().configuration().build(), /ended before its header/);
    expectStreamError(
      new StreamWriter().header().configuration().u8(0).build(),
      /end of stream before the device/,
    );
    expectStreamError(setup().build(), /before the device state/);
    expectStreamError(setup().sectionPart(2).page("mem", MEM, 1).eos().build(), /outside block "mem"/);
    expectStreamError(setup().sectionPart(2).page("rom", 0, 1).build(), /unknown block "rom"/);
    expectStreamError(
      setup()
        .sectionPart(2)
        .be64(0x40 | 0x20)
        .build(),
      /flags 0x60 .*not supported/,
    );
    expectStreamError(
      new StreamWriter()
        .header()
        .sectionStart(1, 2, "ram", 4)
        .be64(0x08 | 0x20)
        .build(),
      /no block was named/,
    );
    expectStreamError(setup().sectionPart(9).build(), /not the RAM section/);
    expectStreamError(setup().sectionPart(2).eos().footer(3).build(), /footer for 3/);
    expectStreamError(
      new StreamWriter().header().sectionStart(1, 2, "block", 1).build(),
      /unsupported iterable section "block"/,
    );
    expectStreamError(new StreamWriter().header().sectionStart(4, 5, "timer", 1).build(), /before any RAM/);
    expectStreamError(setup().u8(0x08).build(), /migration command/);
    expectStreamError(setup().u8(0x42).build(), /unknown section type 0x42/);
    expectStreamError(
      new StreamWriter()
        .header()
        .sectionStart(1, 2, "ram", 4)
        .ramBlocks([["other", MEM]])
        .build(),
      /no RAM block "mem"/,
    );
    expectStreamError(
      new StreamWriter()
        .header()
        .sectionStart(1, 2, "ram", 4)
        .be64(MEM | 0x04)
        .idstr("mem")
        .be64(MEM + GUEST_PAGE_SIZE)
        .build(),
      /has length/,
    );
    expectStreamError(new StreamWriter().header().sectionStart(1, 2, "r\x01m", 4).build(), /non-printable/);
    // A device part that does not end with EOF (e.g. a VM description follows it).
    expectStreamError(
      setup()
        .sectionStart(4, 3, "timer", 1)
        .bytes(Buffer.from("x"))
        .footer(3)
        .u8(0x06)
        .be32(2)
        .bytes(Buffer.from("{}"))
        .build(),
      /does not end with QEMU_VM_EOF/,
    );
  });

  test("the device part is bounded and the parser refuses input after an error", () => {
    const parser = new MigrationStreamParser({ ramBlock: "mem", onPage: () => {}, maxDeviceStateBytes: 64 });
    const head = new StreamWriter()
      .header()
      .sectionStart(1, 2, "ram", 4)
      .ramBlocks([["mem", MEM]])
      .eos()
      .footer(2)
      .build();
    parser.push(head);
    assert.throws(
      () => parser.push(new StreamWriter().sectionStart(4, 3, "timer", 1).bytes(Buffer.alloc(100)).build()),
      /device state larger than 64 bytes/,
    );
    assert.throws(() => parser.push(Buffer.from([0])), /device state larger/);
    assert.throws(() => parser.finish(), /device state larger/);
  });

  test("an exception from the page callback stops the parse", () => {
    const { stream } = sampleStream();
    const parser = new MigrationStreamParser({
      ramBlock: "mem",
      onPage: (index) => {
        if (index === 5) throw new Error("sink full");
      },
    });
    assert.throws(() => parser.push(stream), /sink full/);
    assert.throws(() => parser.finish(), /sink full/);
  });
});
