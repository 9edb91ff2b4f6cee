"""A stand-in for `python -m vllm.entrypoints.openai.api_server`, for fast tests of process handling.

`sprint serve --python WRAPPER` runs WRAPPER with vLLM's command line; the wrapper runs this script,
which reads the flags it needs (--port, --served-model-name), forks an "engine" child in its process
group as vLLM does, and answers what vllm-router and sprint ask a server: GET /health, /v1/models,
/metrics, and POST /v1/completions with a fixed text. Nothing here is a model.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

METRICS = "vllm:request_success_total{finished_reason=\"length\"} 0.0\nvllm:prefix_cache_queries_total 0.0\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-m")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-model-name", default="stand-in")
    parser.add_argument("--host", default="127.0.0.1")
    args, _ = parser.parse_known_args()
    # vLLM's engine is a second process in the server's group: stopping the group must reach it too
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    model = args.served_model_name

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def _send(self, code: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, b"")
            elif self.path.rstrip("/") == "/v1/models":
                self._send(200, json.dumps({"object": "list", "data": [{"id": model, "object": "model"}]}).encode())
            elif self.path == "/metrics":
                self._send(200, METRICS.encode(), "text/plain")
            else:
                self._send(404, b"{}")

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = {"id": "cmpl-1", "object": "text_completion", "model": model,
                    "choices": [{"index": 0, "text": "ok", "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
            self._send(200, json.dumps(body).encode())

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
