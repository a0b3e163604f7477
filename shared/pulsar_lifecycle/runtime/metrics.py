"""Prometheus metrics of a locally run function, served on 127.0.0.1 only."""
from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Summary, start_http_server

log = logging.getLogger(__name__)
# Pulsar's Python instance's user-metric Summary (pulsar-functions/instance/.../contextimpl.py).
USER_METRIC_SUMMARY = "pulsar_function_user_metric"
_LABELLED = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}$")


def parse_metric_name(name: str) -> Tuple[str, Dict[str, str]]:
    """`name{k=v,k2=v2}` -> ("name", {"k": "v", ...}); a plain name has no labels."""
    m = _LABELLED.match(name)
    if not m:
        return name, {}
    labels: Dict[str, str] = {}
    for part in filter(None, (p.strip() for p in m.group(2).split(","))):
        k, _, v = part.partition("=")
        labels[k.strip()] = v.strip().strip('"')
    return m.group(1), labels


@dataclass
class FunctionMetrics:
    """The runtime's metrics (received/processed/exceptions, user Summary) plus last-value gauges.

    `record_user_metric` feeds the user-metric Summary `pulsar_function_user_metric` (series
    `pulsar_function_user_metric_sum` / `_count` with a `metric` label), named as Pulsar's Python
    instance names it (contextimpl.py; the Java instance's is `pulsar_function_user_metric_`, whose
    series have two underscores), so dashboards and alerts read both runtimes alike. Each value
    also sets a gauge under the metric's own name, so names such as
    `pulsar_delayed_message_index_bucket_total` appear as themselves on the local endpoint.
    """

    fqfn: str
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    _gauges: Dict[str, Gauge] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        labels = ["fqfn", "instance_id"]
        self.received = Counter("pulsar_function_received", "Messages received", labels, registry=self.registry)
        self.processed = Counter("pulsar_function_processed_successfully", "Processed OK", labels, registry=self.registry)
        self.user_exceptions = Counter("pulsar_function_user_exceptions", "process() raised", labels, registry=self.registry)
        self.system_exceptions = Counter("pulsar_function_system_exceptions", "publish/serde failed", labels, registry=self.registry)
        self.user_summary = Summary(USER_METRIC_SUMMARY, "Pulsar Function user defined metric", labels + ["metric"],
                                    registry=self.registry)

    def record_user_metric(self, name: str, value: float, instance_id: int = 0) -> None:
        self.user_summary.labels(self.fqfn, str(instance_id), name).observe(value)
        base, labels = parse_metric_name(name)
        key = base + "|" + ",".join(sorted(labels))
        with self._lock:
            gauge = self._gauges.get(key)
            if gauge is None:
                try:
                    gauge = Gauge(base, f"{base} (last value recorded by the function)",
                                  ["fqfn"] + sorted(labels), registry=self.registry)
                except ValueError:
                    return  # the name clashes with a runtime metric; the Summary still has it
                self._gauges[key] = gauge
        gauge.labels(self.fqfn, *[labels[k] for k in sorted(labels)]).set(value)

    def serve(self, port: int) -> Optional[int]:
        """Expose the registry on http://127.0.0.1:port/metrics (never 0.0.0.0)."""
        server, _thread = start_http_server(port, addr="127.0.0.1", registry=self.registry)
        bound = int(server.server_address[1])
        log.info("event=metrics_listening url=http://127.0.0.1:%d/metrics fqfn=%s", bound, self.fqfn)
        return bound
