"""Small functions used by the runtime tests (imported by className like Pulsar does)."""
from __future__ import annotations

from typing import Any


class FailFirst:
    """Raises on a message's first delivery, exclaims it on redelivery."""

    def process(self, input: Any, context: Any) -> str:
        if context.message.redelivery_count() == 0:
            raise RuntimeError(f"first delivery of {input}")
        return f"{input}!"


class ManualAck:
    """Acks only inputs that do not start with 'keep'; publishes nothing."""

    def process(self, input: Any, context: Any) -> None:
        if not str(input).startswith("keep"):
            context.ack(context.get_message_id(), context.get_current_message_topic_name())
        return None


class Describe:
    """Returns a description of the context's view of the current message."""

    def process(self, input: Any, context: Any) -> str:
        import json

        return json.dumps({
            "input": input, "key": context.get_message_key(), "props": context.get_message_properties(),
            "topic": context.get_current_message_topic_name(), "seq": context.get_message_sequence_id(),
            "partition": context.get_message_partition_index(), "inputs": context.get_input_topics(),
            "output": context.get_output_topic(), "user": context.get_user_config_map(),
            "secret": context.get_secret("token"), "fn": context.get_function_name(),
            "instance": context.get_instance_id(), "client": type(context.get_pulsar_client()).__name__,
        })


class Stateful:
    """Counts and remembers the last input in state; returns the count."""

    def process(self, input: Any, context: Any) -> str:
        context.incr_counter("n", 1)
        context.put_state("last", str(input))
        return str(context.get_counter("n"))


class Fanout:
    """Publishes each input with context.publish to the topics in userConfig `to`, with a property."""

    def process(self, input: Any, context: Any) -> None:
        for topic in context.get_user_config_value("to"):
            context.publish(topic, f"{input}@{topic.rsplit('-', 1)[-1]}", properties={"src": str(input)})
        return None
