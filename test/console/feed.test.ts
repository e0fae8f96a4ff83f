/**
 * The console's live feed (src/console/feed.ts) over a real HTTP connection: a page gets the whole state and
 * then patches that add up to the daemon's state; a page that stops reading while 500 sandboxes change every
 * tick costs the daemon a bounded buffer (no queue of patches), and when it reads again it catches up with one
 * full state. The services are the HTTP-level test double (the feed only reads their lists).
 */
import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { connect, type Socket } from "node:net";
import { after, before, describe, it } from "node:test";
import { createMetrics } from "../../src/api/metrics.js";
import { ConsoleFeed } from "../../src/console/feed.js";
import { HistoryRecorder } from "../../src/console/history.js";
import type { FeedPatch, FeedState, SandboxWire } from "../../src/console/protocol.js";
import { ServicesDouble } from "../api/services-double.js";

const MAX_BUFFERED = 64 * 1024;

describe("the console feed", () => {
  const services = new ServicesDouble();
  const metrics = createMetrics(services, { version: "test" });
  const history = new HistoryRecorder(services.sandboxes, { intervalMs: 50 });
  const feed = new ConsoleFeed(services, metrics, history, "/srv/snapshots", {
    tickMs: 20,
    snapshotsEveryMs: 20,
    usageEveryMs: 100,
    maxBufferedBytes: MAX_BUFFERED,
    maxPendingEntities: 600,
  });
  const responses: http.ServerResponse[] = [];
  const server = http.createServer((_req, res) => {
    res.writeHead(200, { "content-type": "text/event-stream" });
    responses.push(res);
    void feed.subscribe(res);
  });
  let port = 0;

  before(async () => {
    history.start();
    await services.sandboxes.spawn({ snapshotTag: "py", n: 500 });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    port = (server.address() as AddressInfo).port;
  });
  after(async () => {
    history.stop();
    await feed.close();
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });

  /** Every sandbox's metadata says `round`: 500 changed entities. */
  const touchAll = (round: number) => {
    for (const sb of services.sandboxesById.values()) sb.metadata = { round: String(round) };
  };

  it("sends the state, then patches that add up to the daemon's state", async () => {
    const client = new FeedClient(port);
    try {
      await client.until(() => client.state !== undefined);
      assert.equal(client.state?.sandboxes.length, 500);
      assert.ok(client.state?.snapshots.some((s) => s.tag === "py" && s.dir === "/srv/snapshots/py"));
      touchAll(1);
      const killed = [...services.sandboxesById.keys()].slice(0, 10);
      for (const id of killed) services.sandboxesById.delete(id);
      await client.until(() => client.sandboxes.size === 490 && client.everyRound("1"));
      assert.ok(client.patches > 0, "changes arrived as patches");
      assert.equal(client.fullStates, 1);
      for (const id of killed) assert.equal(client.sandboxes.has(id), false);
    } finally {
      client.close();
    }
  });

  it("holds a bounded buffer for a page that stops reading, and coalesces what it missed", async () => {
    const client = new FeedClient(port);
    try {
      await client.until(() => client.state !== undefined);
      const res = responses[responses.length - 1] as http.ServerResponse;
      client.pause();
      let round = 100;
      let largestBuffer = 0;
      let ticks = 0;
      const started = Date.now();
      while (Date.now() - started < 3000) {
        // New sandboxes as well: distinct entities pile up past the pending bound (600) while it does not read.
        await services.sandboxes.spawn({ snapshotTag: "py", n: 5 });
        touchAll(round++);
        largestBuffer = Math.max(largestBuffer, res.writableLength);
        ticks++;
        await new Promise((r) => setTimeout(r, 20));
      }
      // One full state is the most that is ever written past the bound.
      const oneState = JSON.stringify(feed.state()).length + 100;
      assert.ok(
        largestBuffer <= MAX_BUFFERED + oneState,
        `the daemon buffered ${largestBuffer} bytes for a stalled page (bound ${MAX_BUFFERED} + one state ${oneState})`,
      );
      const last = String(round - 1);
      const eventsBefore = client.patches + client.fullStates;
      const statesBefore = client.fullStates;
      client.resume();
      await client.until(
        () => client.everyRound(last) && client.sandboxes.size === services.sandboxesById.size,
      );
      const caughtUpWith = client.patches + client.fullStates - eventsBefore;
      assert.ok(
        client.fullStates > statesBefore,
        "caught up with a full state once the changes outgrew the bound",
      );
      // What the kernel's socket buffers held when the page stopped, plus the catch-up: nowhere near a backlog.
      assert.ok(
        caughtUpWith < ticks / 3,
        `${caughtUpWith} events to catch up after ${ticks} rounds of changes`,
      );
      assert.deepEqual(new Set(client.sandboxes.keys()), new Set(services.sandboxesById.keys()));
    } finally {
      client.close();
    }
  });
});

/** A page's side of the feed: a raw socket, so reading can be paused like a stuck tab's. */
class FeedClient {
  state: FeedState | undefined;
  readonly sandboxes = new Map<string, SandboxWire>();
  patches = 0;
  fullStates = 0;
  private buffer = "";
  private readonly socket: Socket;

  constructor(port: number) {
    this.socket = connect(port, "127.0.0.1");
    this.socket.write("GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    this.socket.on("data", (chunk) => this.onData(chunk.toString("utf8")));
    this.socket.on("error", () => {});
  }

  pause(): void {
    this.socket.pause();
  }

  resume(): void {
    this.socket.resume();
  }

  close(): void {
    this.socket.destroy();
  }

  everyRound(round: string): boolean {
    return this.sandboxes.size > 0 && [...this.sandboxes.values()].every((sb) => sb.metadata.round === round);
  }

  async until(condition: () => boolean, ms = 10_000): Promise<void> {
    const deadline = Date.now() + ms;
    while (!condition()) {
      if (Date.now() > deadline) throw new Error("the feed did not get there in time");
      await new Promise((r) => setTimeout(r, 10));
    }
  }

  private onData(text: string): void {
    this.buffer += text;
    // The HTTP head (and chunk sizes: the response is chunked) are not SSE lines; only event blocks are parsed.
    for (let end = this.buffer.indexOf("\n\n"); end !== -1; end = this.buffer.indexOf("\n\n")) {
      const block = this.buffer.slice(0, end);
      this.buffer = this.buffer.slice(end + 2);
      const event = /^event: (.*)$/m.exec(block)?.[1];
      const data = /^data: (.*)$/m.exec(block)?.[1];
      if (event === "state") this.onState(JSON.parse(data as string) as FeedState);
      else if (event === "patch") this.onPatch(JSON.parse(data as string) as FeedPatch);
    }
  }

  private onState(state: FeedState): void {
    this.state = state;
    this.fullStates++;
    this.sandboxes.clear();
    for (const sb of state.sandboxes) this.sandboxes.set(sb.id, sb);
  }

  private onPatch(patch: FeedPatch): void {
    this.patches++;
    for (const id of patch.sandboxes?.remove ?? []) this.sandboxes.delete(id);
    for (const sb of patch.sandboxes?.upsert ?? []) this.sandboxes.set(sb.id, sb);
  }
}
