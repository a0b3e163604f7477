"""A small JSON-over-HTTP helper with timeouts and fail-over across several base URLs."""
from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import requests
import requests.adapters
import requests.utils

from ..ports import StorageError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HttpResult:
    """Status code and body of one answered request."""

    status: int
    text: str

    def json(self) -> Any:
        """The body parsed as JSON; StorageError when it is not JSON."""
        import json

        try:
            return json.loads(self.text)
        except ValueError as exc:
            raise StorageError(f"expected a JSON body, got {self.text[:200]!r}: {exc}") from None


# requests keeps 10 connections per host by default; more concurrent callers would open and drop
# a connection per call beyond that.
DEFAULT_POOL_SIZE = 10


def pooled_session(pool_size: int = DEFAULT_POOL_SIZE) -> requests.Session:
    """A Session keeping up to `pool_size` connections per host, for as many concurrent callers."""
    session = requests.Session()
    adapter = requests.adapters.HTTPAdapter(pool_maxsize=max(DEFAULT_POOL_SIZE, pool_size))
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


@dataclass
class HttpEndpoints:
    """Sends a request to one of `base_urls`, moving on to the next when one cannot be reached.

    An HTTP error status is an answer, not a connection failure: it is returned, not retried
    elsewhere (another node would give the same answer about the same ledger)."""

    base_urls: Sequence[str]
    timeout: float = 10.0
    headers: Dict[str, str] = field(default_factory=dict)
    session: requests.Session = field(default_factory=pooled_session)
    _rr: Any = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _env: Dict[str, Dict[str, Any]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        urls: List[str] = [u.rstrip("/") for u in self.base_urls if u]
        if not urls:
            raise ValueError("at least one base URL is required")
        for u in urls:
            if not u.startswith(("http://", "https://")):
                raise ValueError(f"base URL must start with http:// or https://, got {u!r}")
        self.base_urls = urls
        self._rr = itertools.cycle(range(len(urls)))
        # What requests reads from the environment on every call (proxies and no_proxy, a CA
        # bundle, netrc credentials) depends only on the host, so it is read once here: the
        # per-call lookup walks os.environ twice and cost about a third of a call's CPU.
        if self.session.trust_env:
            for base in urls:
                env = self.session.merge_environment_settings(base, {}, None, None, None)
                netrc = requests.utils.get_netrc_auth(base)
                self._env[base] = {**env, **({"auth": netrc} if netrc else {})}
            self.session.trust_env = False

    def request(self, method: str, path: str, params: Optional[Dict[str, Any]] = None, **kw: Any) -> HttpResult:
        """Send; StorageError only when no endpoint could be reached."""
        with self._lock:
            start = next(self._rr)
        headers = {**self.headers, **(kw.pop("headers", None) or {})}
        errors = []
        for i in range(len(self.base_urls)):
            base = self.base_urls[(start + i) % len(self.base_urls)]
            try:
                resp = self.session.request(
                    method, base + path, params=params, timeout=self.timeout, headers=headers or None,
                    **{**self._env.get(base, {}), **kw},
                )
            except requests.RequestException as exc:
                log.warning("http %s %s%s unreachable: %s", method, base, path, exc)
                errors.append(f"{base}: {type(exc).__name__}")
                continue
            return HttpResult(resp.status_code, resp.text)
        raise StorageError(f"{method} {path}: no endpoint reachable ({'; '.join(errors)})")

    def close(self) -> None:
        """Close pooled connections."""
        self.session.close()
