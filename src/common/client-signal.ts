/**
 * An AbortSignal that fires when an HTTP client goes away before its response was sent, so a spawn, exec or
 * eval it no longer waits for is cancelled instead of finishing for nobody. Watches the response: a request's
 * own 'close' also fires once its body has been read, which says nothing about the client.
 */
import type { ServerResponse } from "node:http";
import { ForkdError } from "./errors.js";

export function responseGoneSignal(response: ServerResponse, what: string): AbortSignal {
  const controller = new AbortController();
  response.once("close", () => {
    if (!response.writableFinished) {
      controller.abort(new ForkdError("unavailable", `client disconnected (${what})`));
    }
  });
  return controller.signal;
}
