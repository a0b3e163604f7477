"""pulsar-lifecycle: Pulsar Functions for ledger lifecycle and delayed delivery."""

__version__ = "0.1.0"
