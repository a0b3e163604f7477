from .delayed_producer import DelayedProducer, now_ms

__all__ = ["DelayedProducer", "now_ms"]
