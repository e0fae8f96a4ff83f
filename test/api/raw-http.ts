/** A bare node:http client for socket-level tests: exact bytes in and out, no retries, no error mapping. */
import http, { type ClientRequest, type IncomingMessage } from "node:http";
import https from "node:https";

export type Target = { socketPath: string } | { host: string; port: number; ca?: Buffer };

export interface RawResponse {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
  text: string;
  json<T = Record<string, unknown>>(): T;
}

export function open(
  target: Target,
  method: string,
  path: string,
  headers: Record<string, string> = {},
): ClientRequest {
  if ("socketPath" in target) return http.request({ socketPath: target.socketPath, method, path, headers });
  const options = { host: target.host, port: target.port, method, path, headers };
  return target.ca
    ? https.request({ ...options, ca: target.ca, servername: "localhost" })
    : http.request(options);
}

export function responseOf(request: ClientRequest): Promise<IncomingMessage> {
  return new Promise((resolve, reject) => {
    request.once("response", resolve);
    request.once("error", reject);
  });
}

export async function readAll(response: IncomingMessage): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const chunk of response as AsyncIterable<Buffer>) parts.push(chunk);
  return Buffer.concat(parts);
}

export async function send(
  target: Target,
  method: string,
  path: string,
  options: { headers?: Record<string, string>; json?: unknown; body?: Buffer | string } = {},
): Promise<RawResponse> {
  const headers = { ...options.headers };
  let body = options.body;
  if (options.json !== undefined) {
    body = JSON.stringify(options.json);
    headers["content-type"] = "application/json";
  }
  const request = open(target, method, path, headers);
  const answer = responseOf(request);
  request.end(body);
  const response = await answer;
  const bytes = await readAll(response);
  return {
    status: response.statusCode ?? 0,
    headers: response.headers,
    body: bytes,
    text: bytes.toString("utf8"),
    json: <T>() => JSON.parse(bytes.toString("utf8")) as T,
  };
}

/** Splits an NDJSON response into parsed lines as they arrive. */
export async function* ndjsonLines(response: IncomingMessage): AsyncGenerator<Record<string, unknown>> {
  let pending = "";
  for await (const chunk of response as AsyncIterable<Buffer>) {
    pending += chunk.toString("utf8");
    for (let nl = pending.indexOf("\n"); nl !== -1; nl = pending.indexOf("\n")) {
      const line = pending.slice(0, nl);
      pending = pending.slice(nl + 1);
      if (line.trim() !== "") yield JSON.parse(line) as Record<string, unknown>;
    }
  }
  if (pending.trim() !== "") yield JSON.parse(pending) as Record<string, unknown>;
}
