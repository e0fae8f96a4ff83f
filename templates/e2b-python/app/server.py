"""The e2b-python recipe's app: a small HTTP service that answers with a table (tabulate, installed by the
template's pipInstall step) of the parts it knows. Started by the template's start command in the parent, so it
is already serving in every sandbox."""

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tabulate import tabulate

PARTS = [("gear", 12.5), ("spring", 3.2), ("bearing", 7.95)]


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/json":
            body = json.dumps({"title": os.environ.get("APP_TITLE", ""), "parts": PARTS}).encode()
            kind = "application/json"
        else:
            body = (tabulate(PARTS, headers=["part", "price"], tablefmt="github") + "\n").encode()
            kind = "text/plain; charset=utf-8"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), Handler).serve_forever()
