/** timeoutSignal must fire even after garbage collection (AbortSignal.any + AbortSignal.timeout does not on Node 20). */
import assert from "node:assert/strict";
import { getEventListeners } from "node:events";
import { describe, test } from "node:test";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { abortError, deadlineSignal, timeoutSignal } from "../../src/common/deadline.js";
import { ForkdError } from "../../src/common/errors.js";

setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;

async function collectGarbageFor(ms: number): Promise<void> {
  const until = Date.now() + ms;
  while (Date.now() < until) {
    gc();
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

describe("timeoutSignal", () => {
  test("fires after the deadline although nothing else references it, with a TimeoutError", async () => {
    const { signal } = timeoutSignal(100);
    await collectGarbageFor(400);
    assert.equal(signal.aborted, true);
    const err = abortError(signal, "waiting");
    assert.ok(err instanceof ForkdError);
    assert.equal(err.code, "timeout");
  });

  test("follows its parent's abort and reason", () => {
    const parent = new AbortController();
    const { signal } = timeoutSignal(60_000, parent.signal);
    parent.abort(new Error("caller gave up"));
    assert.equal(signal.aborted, true);
    assert.equal((signal.reason as Error).message, "caller gave up");
    assert.equal(timeoutSignal(60_000, AbortSignal.abort("already")).signal.aborted, true);
  });

  test("dispose() stops the timer", async () => {
    const timeout = timeoutSignal(50);
    timeout.dispose();
    await new Promise((resolve) => setTimeout(resolve, 150));
    assert.equal(timeout.signal.aborted, false);
  });
});

describe("deadlineSignal", () => {
  test("fires after garbage collection even when combined with parents", async () => {
    const parentA = new AbortController();
    const parentB = new AbortController();
    const { signal } = deadlineSignal(100, parentA.signal, parentB.signal);
    await collectGarbageFor(300);
    assert.equal(signal.aborted, true);
    const err = abortError(signal, "waiting");
    assert.ok(err instanceof ForkdError && err.code === "timeout");
  });

  test("aborts with any parent", () => {
    const parentA = new AbortController();
    const { signal } = deadlineSignal(60_000, undefined, parentA.signal);
    parentA.abort(new Error("stop"));
    assert.equal(signal.aborted, true);
    assert.equal((signal.reason as Error).message, "stop");
  });

  test("dispose() detaches from the parent, so a long-lived parent does not collect listeners", () => {
    const parent = new AbortController();
    const deadlines = Array.from({ length: 20 }, () => deadlineSignal(60_000, parent.signal));
    assert.equal(getEventListeners(parent.signal, "abort").length, 20);
    for (const deadline of deadlines) deadline.dispose();
    assert.equal(getEventListeners(parent.signal, "abort").length, 0);
  });
});
