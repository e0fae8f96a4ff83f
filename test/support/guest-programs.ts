/**
 * Python programs the network tests run inside guests (stdlib only, so any image with python3 has them): a
 * fetch helper for the warm interpreter, an HTTP echo server (optionally HTTPS) and a WebSocket echo server.
 * Shared by test/net (the forkd API) and test/e2b (the E2B SDK), which reach them through different fronts.
 */
import WebSocket from "ws";

/** Defined once in a sandbox's warm interpreter: fetch(url) -> "OK <body>" or "ERR <exception>". */
export const FETCH_DEF = `
import urllib.request
def fetch(url, timeout=8):
    try:
        return "OK " + urllib.request.urlopen(url, timeout=timeout).read().decode()
    except Exception as e:
        return "ERR " + type(e).__name__ + " " + str(e)
`;

/**
 * `python3 http_echo.py PORT [CERT KEY]`: answers every GET and POST with JSON {path, host, headers, body, tls}
 * (what reached the guest's server); with CERT and KEY it speaks HTTPS.
 */
export const HTTP_ECHO = `
import json, ssl, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
tls = len(sys.argv) > 3
class Echo(BaseHTTPRequestHandler):
    def do_GET(self):
        n = int(self.headers.get("content-length") or 0)
        body = json.dumps({"path": self.path, "host": self.headers.get("host"), "headers": dict(self.headers),
                           "body": self.rfile.read(n).decode(), "tls": tls}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_POST = do_GET
    def log_message(self, *args):
        pass
srv = ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), Echo)
if tls:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(sys.argv[2], sys.argv[3])
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
srv.serve_forever()
`;

/** `python3 ws_echo.py PORT`: a WebSocket echo server (one text frame of up to 125 bytes per connection). */
export const WS_ECHO = `
import base64, hashlib, socket, sys
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", int(sys.argv[1]))); srv.listen(4)
while True:
    c, _ = srv.accept()
    head = b""
    while b"\\r\\n\\r\\n" not in head: head += c.recv(1024)
    key = [l.split(b":", 1)[1].strip() for l in head.split(b"\\r\\n") if l.lower().startswith(b"sec-websocket-key")][0]
    accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: websocket\\r\\nConnection: Upgrade\\r\\nSec-WebSocket-Accept: " + accept + b"\\r\\n\\r\\n")
    frame = c.recv(2 + 4 + 125)
    n = frame[1] & 0x7f; mask = frame[2:6]
    data = bytes(b ^ mask[i % 4] for i, b in enumerate(frame[6:6 + n]))
    c.sendall(bytes([0x81, len(data)]) + data); c.close()
`;

/**
 * The echo of one WebSocket message sent to WS_ECHO through the daemon's listener at `httpUrl` (`/socket`),
 * or the status of the refused upgrade.
 */
export function throughWebSocket(
  httpUrl: string,
  headers: Record<string, string>,
  message: string,
): Promise<{ echoed?: string; status?: number }> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`${httpUrl.replace(/^http/, "ws")}/socket`, { headers });
    ws.once("open", () => ws.send(message));
    ws.once("message", (data) => {
      resolve({ echoed: String(data) });
      ws.close();
    });
    ws.once("unexpected-response", (_req, res) => resolve({ status: res.statusCode }));
    ws.once("error", reject);
  });
}

/**
 * `python3 stream_forever.py PORT`: answers every request, WebSocket upgrades included, with a plain 200 whose
 * chunked body never ends (a guest that streams a non-101 answer to an upgrade, as a hostile one may).
 */
export const STREAM_FOREVER = `
import socket, sys, threading
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", int(sys.argv[1]))); srv.listen(16)
def serve(c):
    try:
        head = b""
        while b"\\r\\n\\r\\n" not in head:
            data = c.recv(4096)
            if not data: return
            head += data
        c.sendall(b"HTTP/1.1 200 OK\\r\\ncontent-type: text/plain\\r\\ntransfer-encoding: chunked\\r\\n\\r\\n")
        chunk = b"x" * 16384
        while True: c.sendall(b"%x\\r\\n%s\\r\\n" % (len(chunk), chunk))
    except OSError:
        pass
    finally:
        c.close()
while True:
    c, _ = srv.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
`;
