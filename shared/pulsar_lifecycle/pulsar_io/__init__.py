"""Helpers around pulsar-client that several engines' adapters share.

Subscribing with the broker's quirks handled (`subscribe`), readers and the native consumer
(`readers`, `native_consumer`), producers with checked sends (`producers`), and the watchdog that
re-subscribes a consumer that stops receiving (`stall_watchdog`).
"""
__all__: list = []
