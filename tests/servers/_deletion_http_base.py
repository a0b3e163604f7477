"""Shared plumbing for the local test servers: a threaded HTTP server on 127.0.0.1 only,
seeded fault injection, and start/stop as a context manager."""
from __future__ import annotations

import json
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, Optional, Tuple
from urllib.parse import parse_qs, urlparse

Route = Callable[[str, Dict[str, str], bytes], Tuple[int, Any]]


class LocalHttpServer:
    """Base class: subclasses implement `route(method, path, params, body) -> (status, body)`.

    `fail_rate` makes that share of requests answer 500 before doing anything (seeded, so runs
    repeat). Bodies that are dicts/lists are sent as JSON, strings as text."""

    def __init__(self, fail_rate: float = 0.0, seed: int = 0) -> None:
        self.latency_s = 0.0  # added before every answer (to make runs take long enough to interrupt)
        if not 0.0 <= fail_rate <= 1.0:
            raise ValueError(f"fail_rate must be within [0, 1], got {fail_rate}")
        self.fail_rate = fail_rate
        self._rng = random.Random(seed)
        self.lock = threading.RLock()
        self.injected_failures = 0
        self.requests = 0
        self._httpd: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    # -- to override -------------------------------------------------------------------------
    def route(self, method: str, path: str, params: Dict[str, str], body: bytes) -> Tuple[int, Any]:
        raise NotImplementedError

    # -- plumbing ------------------------------------------------------------------------------
    def _should_fail(self) -> bool:
        with self.lock:
            self.requests += 1
            if self.fail_rate and self._rng.random() < self.fail_rate:
                self.injected_failures += 1
                return True
            return False

    def _handler(self) -> type:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def setup(self) -> None:
                super().setup()
                # Headers and body go out in two writes; without this, Nagle + delayed ACK add 40 ms.
                import socket

                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                parsed = urlparse(self.path)
                params = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
                if server.latency_s:
                    import time

                    time.sleep(server.latency_s)
                if server._should_fail():
                    status, out = 500, "Internal Server Error (injected)"
                else:
                    try:
                        status, out = server.route(method, parsed.path, params, body)
                    except Exception as exc:  # a server bug shows as 500 with its text
                        status, out = 500, f"{type(exc).__name__}: {exc}"
                if isinstance(out, (dict, list)):
                    data, ctype = json.dumps(out).encode(), "application/json"
                else:
                    data, ctype = str(out).encode(), "text/plain"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_DELETE(self) -> None:
                self._serve("DELETE")

            def do_PUT(self) -> None:
                self._serve("PUT")

            def do_POST(self) -> None:
                self._serve("POST")

        return Handler

    def start(self) -> "LocalHttpServer":
        """Bind 127.0.0.1 on a free port and serve in a daemon thread."""
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        """http://127.0.0.1:<port>"""
        assert self._httpd is not None, "server not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def stop(self) -> None:
        """Shut down and wait for the thread (bounded)."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            if self._thread is not None:
                self._thread.join(timeout=5)
            self._httpd = None

    def __enter__(self) -> "LocalHttpServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
