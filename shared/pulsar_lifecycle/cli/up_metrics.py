"""`up --metrics-port`: one Prometheus endpoint with the metrics of every function `up` runs.

Each local runner keeps its own registry (runtime/metrics.py: the runtime's counters, the
user-metric Summary and a gauge per recorded name, labelled by `fqfn`); this endpoint serves
them together, families of one name merged into one (a scrape must not see a name twice), on
127.0.0.1 only, like `localrun --metrics-port-start`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, Optional

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import Metric

log = logging.getLogger(__name__)


@dataclass(eq=False)  # registered as a collector: CollectorRegistry keys its collectors by identity
class MergedRegistries:
    """A collector yielding the families of several registries, merged by name."""

    registries: Callable[[], Iterable[CollectorRegistry]]

    def collect(self) -> Iterator[Metric]:
        """One family per name, with the samples of every registry that has it."""
        merged: Dict[str, Metric] = {}
        for registry in self.registries():
            for family in registry.collect():
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                into.samples.extend(family.samples)
        yield from merged.values()


@dataclass
class UpMetricsServer:
    """The HTTP endpoint over the runners of a LocalService (`runners[name].metrics`)."""

    service: Any
    port: int
    bound: Optional[int] = None
    _server: Any = field(default=None, repr=False)

    def _registries(self) -> Iterable[CollectorRegistry]:
        for runner in list(self.service.runners.values()):
            metrics = getattr(runner, "metrics", None)
            if metrics is not None:
                yield metrics.registry

    def start(self) -> "UpMetricsServer":
        """Listen on http://127.0.0.1:port/metrics (port 0: a free one, in `bound`)."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(MergedRegistries(self._registries))  # type: ignore[arg-type]
        try:
            self._server, _thread = start_http_server(self.port, addr="127.0.0.1", registry=registry)
        except OSError as exc:
            raise OSError(f"--metrics-port {self.port}: cannot listen on 127.0.0.1:{self.port}: {exc}") from exc
        self.bound = int(self._server.server_address[1])
        log.info("event=up_metrics_listening url=http://127.0.0.1:%d/metrics", self.bound)
        return self

    def stop(self) -> None:
        """Stop listening (safe twice)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
