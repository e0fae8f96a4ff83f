/**
 * What a Connect handler knows about its call: the sandbox (set by the data plane's hook), the caller's view of
 * the services (servicesOf of the call's request: that one sandbox) and the user.
 */
import { Code, ConnectError, createContextKey, type HandlerContext } from "@connectrpc/connect";
import type { Services } from "../../controller/tenancy/tenant-view.js";
import type { E2bContext } from "../context.js";
import { toConnectError } from "../errors.js";
import { basicAuthUser, type SandboxSession } from "../session.js";
import type { GuestUser } from "./guest-users.js";
import { DEFAULT_USER } from "./version.js";

export const SESSION_KEY = createContextKey<SandboxSession | undefined>(undefined, {
  description: "the sandbox a data-plane call addresses",
});

export const SERVICES_KEY = createContextKey<Services | undefined>(undefined, {
  description: "the services as the call's request may use them (servicesOf)",
});

export function sessionOf(ctx: HandlerContext): SandboxSession {
  const session = ctx.values.get(SESSION_KEY);
  if (session === undefined) throw new ConnectError("no sandbox for this call", Code.Internal);
  return session;
}

/** servicesOf(request) for a Connect call. */
export function servicesOfCall(ctx: HandlerContext): Services {
  const services = ctx.values.get(SERVICES_KEY);
  if (services === undefined) throw new ConnectError("no services for this call", Code.Internal);
  return services;
}

/** The user the call acts as: `Authorization: Basic base64("<user>:")`, else E2B's default user. */
export async function callUser(context: E2bContext, ctx: HandlerContext): Promise<GuestUser> {
  const name = basicAuthUser(ctx.requestHeader.get("authorization") ?? undefined) ?? DEFAULT_USER;
  try {
    return await context.users.lookup(
      servicesOfCall(ctx).sandboxes.files,
      sessionOf(ctx).sandboxId,
      name,
      ctx.signal,
    );
  } catch (err) {
    throw toConnectError(err);
  }
}
