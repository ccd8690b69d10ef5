"""A stand-in for SandboxFusion's server in air's tests: stdlib only, the same /v1/ping and a trivial /run_code.

It honours upstream's HOST and _BYTEFAAS_RUNTIME_PORT variables, binds 127.0.0.1 unless HOST says otherwise (as
upstream does since its PR #80), and exits 0 on SIGTERM, so a clean stop can be told from a kill.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def _send(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v1/ping":
            self._send(200, "pong")
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        if self.path != "/run_code":
            self._send(404, {"detail": "Not Found"})
            return
        try:
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            code, language = request["code"], request["language"]
        except (ValueError, KeyError, TypeError) as exc:
            self._send(422, {"detail": str(exc)})
            return
        if language != "python":
            self._send(200, {"status": "Failed", "message": f"the stub runs python only, not {language}",
                             "compile_result": None, "run_result": None, "executor_pod_name": None, "files": {}})
            return
        started = time.monotonic()
        try:
            done = subprocess.run([sys.executable, "-c", code], input=request.get("stdin") or "", text=True,
                                  capture_output=True, timeout=float(request.get("run_timeout", 10)))
            result = {"status": "Finished", "return_code": done.returncode, "stdout": done.stdout,
                      "stderr": done.stderr}
        except subprocess.TimeoutExpired as exc:
            result = {"status": "TimeLimitExceeded", "return_code": None, "stdout": exc.stdout or "",
                      "stderr": exc.stderr or ""}
        result["execution_time"] = time.monotonic() - started
        ok = result["status"] == "Finished" and result["return_code"] == 0
        self._send(200, {"status": "Success" if ok else "Failed", "message": "", "compile_result": None,
                         "run_result": result, "executor_pod_name": os.environ.get("HOSTNAME"), "files": {}})

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    host = os.environ.get("HOST", "127.0.0.1")
    port = int(os.environ.get("_BYTEFAAS_RUNTIME_PORT", "8080"))
    server = ThreadingHTTPServer((host, port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"stub SandboxFusion listening on {host}:{port}", flush=True)
    server.serve_forever()
    print("stub SandboxFusion stopped", flush=True)


if __name__ == "__main__":
    main()
