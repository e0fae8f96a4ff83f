/**
 * The request-scoped principal: who a request acts for (an admin, or one tenant), resolved once when the request
 * is authenticated (app.ts). Routes reach the services only through its view, `servicesOf(request)`
 * (src/http/request-scope.ts, over controller/tenancy/), so no route can forget the scope.
 */
import type { Token } from "../common/tokens.js";
import { ADMIN, type Principal } from "../controller/tenancy/tenant-view.js";

export { ADMIN, type Principal } from "../controller/tenancy/tenant-view.js";

export function principalOf(token: Token): Principal {
  return token.tenant === null ? ADMIN : { tenant: token.tenant };
}
