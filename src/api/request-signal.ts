/** The client-gone signal of a Fastify request (see common/client-signal.ts). */
import type { FastifyReply, FastifyRequest } from "fastify";
import { responseGoneSignal } from "../common/client-signal.js";

export function clientSignal(request: FastifyRequest, reply: FastifyReply): AbortSignal {
  return responseGoneSignal(reply.raw, `request ${request.id}`);
}
