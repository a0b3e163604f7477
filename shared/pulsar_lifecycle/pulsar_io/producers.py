"""One pool of per-topic producers: created on first use with the pool's settings, flushed and
closed together (before the client closes). Used wherever a component sends to several topics."""
from __future__ import annotations

import logging
import threading
from typing import Any, Dict, List

log = logging.getLogger(__name__)

__all__ = ["ProducerPool"]


class ProducerPool:
    """Topic -> producer of one client, all created with the same `create_producer` keywords.

    Thread-safe: concurrent first uses of a topic create one producer.
    """

    def __init__(self, client: Any, **producer_conf: Any) -> None:
        self.client = client
        self.producer_conf = dict(producer_conf)
        self._producers: Dict[str, Any] = {}
        self._lock = threading.Lock()

    def get(self, topic: str, **create_conf: Any) -> Any:
        """The producer of `topic`, created on first use (with `create_conf` of that first call over
        the pool's settings, as Pulsar's context.publish takes the compression of its first call)."""
        with self._lock:
            prod = self._producers.get(topic)
            if prod is None:
                prod = self.client.create_producer(topic, **{**self.producer_conf, **create_conf})
                self._producers[topic] = prod
            return prod

    def producers(self) -> List[Any]:
        """The producers created so far."""
        with self._lock:
            return list(self._producers.values())

    def flush(self) -> None:
        """Wait until every message sent so far is confirmed or failed."""
        for prod in self.producers():
            prod.flush()

    def close(self) -> None:
        """Flush and close every producer; best effort (the client may already be gone)."""
        with self._lock:
            producers, self._producers = list(self._producers.values()), {}
        for prod in producers:
            for step in (prod.flush, prod.close):  # a failed flush must not keep the producer open
                try:
                    step()
                except Exception as exc:  # closing is best effort; nothing unsent can be saved here
                    log.debug("event=producer_close_failed topic=%s step=%s error=%s",
                              getattr(prod, "topic", lambda: "?")(), step.__name__, exc)

    def __len__(self) -> int:
        with self._lock:
            return len(self._producers)
