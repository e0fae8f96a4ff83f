/**
 * An AbortSignal that fires when the client goes away before its response was sent, so a spawn, exec or eval it
 * no longer waits for is cancelled instead of finishing for nobody.
 */
import type { FastifyReply, FastifyRequest } from "fastify";
import { ForkdError } from "../common/errors.js";

export function clientSignal(request: FastifyRequest, reply: FastifyReply): AbortSignal {
  const controller = new AbortController();
  const onClose = () => {
    if (!reply.raw.writableFinished) {
      controller.abort(new ForkdError("unavailable", `client disconnected (request ${request.id})`));
    }
  };
  reply.raw.once("close", onClose);
  return controller.signal;
}
