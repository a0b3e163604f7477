"""`pulsar-lifecycle delayed send|cancel`: one delayed message from the shell, through the same
producer API as the library (`pulsar_lifecycle.timing.DelayedProducer`, scheduler backend).

`send` prints the id that cancels the message: the scheduling message's position,
`<ledger>:<entry>[:<batch index>]` (with `@<partition>` on a partitioned scheduling topic), the
form of the `__pl_cancel__` property. On a partitioned writer's scheduling topic a keyed message
goes to the partition of its key (Java's JavaStringHash, as every producer of the system routes
it), an unkeyed one round robin; with the writer's config the partitions are addressed by name
(`schedulingTopicPartitions`, so also on pulsar-lite), and a cancel goes to the partition of its
id and is answered on that partition's reply topic. A delay of at least one unit of the DelayLevelSyncer's
strategy (a day, shipped) is parked on its delay-level topic instead (`DelayLevelProducer`, the
syncer's config giving the topic and strategy as the writer's gives its terms); its id is the
parked message's position with `@dl<k>`, k its delay-level partition, and its cancel goes to the
syncer. Every argument (topic, time, delay bound, properties) is checked before anything connects.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import click

from ..clock import wall_clock_ms
from ..scheduling_protocol import MessageRef, ProtocolError
from ..topics import partition_name, strip_partition
from .args import (
    check_service_url,
    check_topic,
    connect_timeout_option,
    format_ms,
    function_config_option,
    parse_duration_ms,
    parse_time_ms,
)
from .client_options import client_options, client_settings, conf_default

log = logging.getLogger(__name__)

DEFAULT_WRITER_CONFIG = "function-configs/bucket-snapshot-writer.yaml"
DEFAULT_SYNCER_CONFIG = "function-configs/delay-level-syncer.yaml"
PARKED_MARK = "@dl"  # `<position>@dl<k>`: a message parked in delay-level partition k
RESERVED_PREFIX = "__pl_"
CANCEL_WAIT_S = 10.0
# `delayed cancel` exit statuses (2 is click's for a bad argument).
EXIT_CANCELLED, EXIT_ALREADY_RELEASED, EXIT_NOT_KNOWN, EXIT_NO_ANSWER = 0, 3, 4, 5


@dataclass(frozen=True)
class WriterTerms:
    """What the writer accepts: its scheduling topic, the longest delay, the allowed targets, and
    how many partitions of its scheduling topic it reads by name."""

    scheduling_topic: str
    max_delay_ms: int
    allowed_prefixes: Tuple[str, ...]  # empty: not known (no writer config), not checked
    partitions: int = 0  # schedulingTopicPartitions (0: unpartitioned, or not known: the broker's count)


def writer_terms(writer_config: Optional[str], scheduling_topic: Optional[str]) -> WriterTerms:
    """The terms from the writer's function config (the shipped one by default) and/or
    --scheduling-topic; click.BadParameter when neither names a scheduling topic."""
    from ..config.settings import defaults_of
    from ..scheduler.config import WriterConfig, parse_writer_config, scheduling_input

    found = function_config_option(writer_config, DEFAULT_WRITER_CONFIG, "--writer-config")
    if found is None:
        if not scheduling_topic:
            raise click.BadParameter(f"no writer config ({DEFAULT_WRITER_CONFIG} is not here): give "
                                     "--writer-config or --scheduling-topic", param_hint="--scheduling-topic")
        max_s = int(defaults_of(WriterConfig)["maxDelaySeconds"])
        return WriterTerms(check_topic("--scheduling-topic", scheduling_topic), max_s * 1000, ())
    path, spec = found
    try:
        topic, _direct = scheduling_input(spec.inputs, spec.user_config or {})
        cfg = parse_writer_config(spec.user_config or {}, topic=topic)
    except ValueError as exc:
        raise click.BadParameter(f"{path}: not a BucketSnapshotWriter config: {exc}", param_hint="--writer-config") from exc
    chosen = check_topic("--scheduling-topic", scheduling_topic) if scheduling_topic else topic
    # The writer's partition count holds for its own topic only (not for another --scheduling-topic).
    partitions = cfg.scheduling_topic_partitions if chosen == topic else 0
    return WriterTerms(chosen, cfg.max_delay_seconds * 1000, tuple(cfg.allowed_target_prefixes), partitions)


@dataclass(frozen=True)
class SyncerTerms:
    """Where long delays park: the syncer's delay-level topic and strategy, and the scheduling
    topic it forwards to ("" with its broker backend)."""

    delay_level_topic: str
    strategy: Any  # delaylevel.strategy.DelayLevelTopicPartitionStrategy
    scheduling_topic: str

    def parks(self, delay_ms: int) -> bool:
        """True when a delay of `delay_ms` is at least one unit and within the strategy's maximum."""
        return self.strategy.unit_ms <= delay_ms <= self.strategy.max_delay_ms


def syncer_terms(syncer_config: Optional[str]) -> Optional[SyncerTerms]:
    """The terms from the syncer's function config (the shipped one by default; None when it is
    not here or `--syncer-config none`); click.BadParameter when it is not a syncer config."""
    from ..delaylevel.config import parse_syncer_config

    if syncer_config is not None and syncer_config.lower() == "none":
        return None
    found = function_config_option(syncer_config, DEFAULT_SYNCER_CONFIG, "--syncer-config")
    if found is None:
        return None
    path, spec = found
    try:
        cfg = parse_syncer_config(spec.user_config or {})
    except ValueError as exc:
        raise click.BadParameter(f"{path}: not a DelayLevelSyncer config: {exc}", param_hint="--syncer-config") from exc
    return SyncerTerms(cfg.delay_level_topic, cfg.strategy,
                       cfg.scheduling_topic if cfg.near_term_backend == "scheduler" else "")


def format_parked_id(message_id: Any, level: int) -> str:
    """The id `delayed cancel` takes for a message parked in delay-level partition `level`."""
    return f"{MessageRef.of(message_id).format_cancel()}{PARKED_MARK}{level}"


def parse_parked_id(text: str) -> Optional[Tuple[MessageRef, int]]:
    """(position, delay-level partition) of a parked message's id; None for a writer's id."""
    ref_text, mark, level = text.strip().rpartition(PARKED_MARK)
    if not mark:
        return None
    if not level.isdigit():
        raise click.BadParameter(f"{text!r}: the delay-level partition after {PARKED_MARK} must be a number",
                                 param_hint="ID")
    try:
        return MessageRef.parse_cancel(ref_text), int(level)
    except ProtocolError as exc:
        raise click.BadParameter(f"{text!r} is not an id `delayed send` printed (<ledger>:<entry>[:<batch>]"
                                 f"{PARKED_MARK}<k>): {exc}", param_hint="ID") from exc


def deliver_at_ms(at: Optional[str], delay: Optional[str], max_delay_ms: int, now_ms: int) -> int:
    """The deliver-at time of `--at` / `--in`, refused when in the past or beyond the writer's
    maxDelaySeconds (it would send such a message to its -INVALID topic)."""
    if (at is None) == (delay is None):
        raise click.UsageError("give exactly one of --at (a time) and --in (a delay)")
    if at is not None:
        when = parse_time_ms("--at", at)
        if when < now_ms:
            raise click.BadParameter(f"{at} is {format_ms(when)}, {(now_ms - when) / 1000:.0f} s in the past",
                                     param_hint="--at")
        option = "--at"
    else:
        when = now_ms + parse_duration_ms("--in", delay or "")
        option = "--in"
    if when - now_ms > max_delay_ms:
        raise click.BadParameter(f"{at or delay} is {(when - now_ms) / 86_400_000:.1f} days away; the writer accepts "
                                 f"at most {max_delay_ms // 1000} s (maxDelaySeconds)", param_hint=option)
    return when


def parse_properties(items: Tuple[str, ...]) -> Dict[str, str]:
    """`key=value` options as a dict; the scheduling protocol's own `__pl_*` names are refused."""
    out: Dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not key=value", param_hint="--property")
        if key.startswith(RESERVED_PREFIX):
            raise click.BadParameter(f"{key!r}: properties starting with {RESERVED_PREFIX} belong to the scheduling "
                                     "protocol", param_hint="--property")
        out[key] = value
    return out


def format_cancel_id(message_id: Any) -> str:
    """The id `delayed cancel` takes, from the scheduling message's id."""
    ref = MessageRef.of(message_id).format_cancel()
    partition = int(message_id.partition())
    return f"{ref}@{partition}" if partition >= 0 else ref


def parse_cancel_id(text: str) -> Tuple[MessageRef, int]:
    """(position, partition or -1) of a `delayed send` id; click.BadParameter when malformed."""
    ref_text, _, part = text.strip().partition("@")
    try:
        ref = MessageRef.parse_cancel(ref_text)
    except ProtocolError as exc:
        raise click.BadParameter(f"{text!r} is not an id `delayed send` printed (<ledger>:<entry>[:<batch>]"
                                 f"[@<partition>]): {exc}", param_hint="ID") from exc
    if part and not part.isdigit():
        raise click.BadParameter(f"{text!r}: the partition after @ must be a number", param_hint="ID")
    return ref, int(part) if part else -1


def _writer_options(f: Any) -> Any:
    f = connect_timeout_option(f)
    f = click.option("--scheduling-topic", default=None,
                     help="The writer's scheduling topic (default: schedulingTopic of --writer-config).")(f)
    f = click.option("--writer-config", default=None,
                     help=f"The BucketSnapshotWriter's config YAML [default: {DEFAULT_WRITER_CONFIG} when present]: "
                          "its scheduling topic, maxDelaySeconds and allowedTargetPrefix.")(f)
    f = click.option("--service-url", required=True, default=conf_default("brokerServiceUrl"),
                     help="pulsar:// or pulsar+ssl:// URL of the broker the writer runs on "
                          "[default: brokerServiceUrl of the client.conf].")(f)
    f = client_options(f)
    return f


def _syncer_option(f: Any) -> Any:
    return click.option("--syncer-config", default=None,
                        help=f"The DelayLevelSyncer's config YAML [default: {DEFAULT_SYNCER_CONFIG} when present]: "
                             "its delay-level topic and strategy; `none`: every delay goes straight to the "
                             "writer.")(f)


@click.group("delayed")
def delayed() -> None:
    """Send a message to be delivered later (through the BucketSnapshotWriter), or cancel one."""


@delayed.command("send")
@click.argument("topic")
@click.argument("payload", required=False)
@click.option("--file", "payload_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Send this file's bytes as the payload.")
@click.option("--at", "at", default=None, help="Deliver at: an ISO 8601 time (UTC unless it says) or epoch ms.")
@click.option("--in", "delay", default=None, help="Deliver after this delay: 90s, 2h, 30d, 1h30m (ms s m h d w).")
@click.option("--key", default=None, help="Message key.")
@click.option("--property", "-p", "props", multiple=True, help="A message property, key=value (repeatable).")
@_syncer_option
@_writer_options
def send(topic: str, payload: Optional[str], payload_file: Optional[str], at: Optional[str], delay: Optional[str],
         key: Optional[str], props: Tuple[str, ...], syncer_config: Optional[str], service_url: str,
         writer_config: Optional[str], scheduling_topic: Optional[str], connect_timeout: float) -> None:
    """Deliver PAYLOAD (or --file) to TOPIC at --at or after --in; prints the id that cancels it.

    A delay of at least one unit of the syncer's strategy (a day, shipped) and within its
    maximum (30 days) is parked on the syncer's delay-level topic, which hands it to the writer
    shortly before it is due; a shorter or longer one goes straight to the writer.

    Example: pulsar-lifecycle delayed send persistent://public/default/orders 'hello' --in 90s
    --service-url pulsar://127.0.0.1:6650
    """
    from ..runtime.connect import open_client
    from ..timing import DelayedProducer

    target = check_topic("TOPIC", topic)
    check_service_url("--service-url", service_url)
    if (payload is None) == (payload_file is None):
        raise click.UsageError("give the payload as an argument or with --file (one of them)")
    data = Path(payload_file).read_bytes() if payload_file else (payload or "").encode("utf-8")
    properties = parse_properties(props)
    terms = writer_terms(writer_config, scheduling_topic)
    if terms.allowed_prefixes and not target.startswith(terms.allowed_prefixes):
        raise click.BadParameter(f"{target} is not under the writer's allowedTargetPrefix "
                                 f"{list(terms.allowed_prefixes)}: it would send the message to its -INVALID topic",
                                 param_hint="TOPIC")
    now = wall_clock_ms()
    when = deliver_at_ms(at, delay, terms.max_delay_ms, now)
    syncer = syncer_terms(syncer_config)
    parking = syncer if syncer is not None and syncer.parks(when - now) else None
    if parking is not None and parking.scheduling_topic \
            and strip_partition(parking.scheduling_topic) != strip_partition(terms.scheduling_topic):
        raise click.BadParameter(f"the syncer forwards to {parking.scheduling_topic}, the writer reads "
                                 f"{terms.scheduling_topic}: give the configs of one system (or --syncer-config none "
                                 "to send straight to the writer)", param_hint="--syncer-config")
    client = open_client(client_settings(service_url), connect_timeout)
    producer = DelayedProducer(client, backend="scheduler", scheduling_topic=terms.scheduling_topic,
                               scheduling_partitions=terms.partitions)
    where = terms.scheduling_topic
    try:
        if parking is None:
            ident = format_cancel_id(producer.send(target, data, when, properties=properties or None, key=key))
        else:
            ident, where = _park(client, producer, parking, target, data, when, properties, key)
    finally:
        producer.close()
        client.close()
    log.info("event=delayed_sent target=%s deliver_at=%d id=%s via=%s", target, when, ident, where)
    click.echo(ident)
    beyond = syncer is not None and parking is None and when - now > syncer.strategy.max_delay_ms
    click.echo(f"deliver at {format_ms(when)} (in {max(0, when - now) / 1000:.1f} s) to {target} via {where}"
               + (" (beyond the syncer's maximum delay: the writer holds it)" if beyond else "")
               + f"; cancel: pulsar-lifecycle delayed cancel {ident} --service-url {service_url}", err=True)


def _park(client: Any, near_term: Any, syncer: SyncerTerms, target: str, data: bytes, when: int,
          properties: Dict[str, str], key: Optional[str]) -> Tuple[str, str]:
    """Send through DelayLevelProducer on the syncer's terms: (the id, where it went)."""
    from ..delaylevel.producer import DelayLevelProducer

    producer = DelayLevelProducer(client, target, near_term, strategy=syncer.strategy,
                                  delay_level_topic=syncer.delay_level_topic)
    try:
        sent = producer.send(data, deliver_at_ms=when, properties=properties or None, key=key)
        producer.flush()  # the syncer's wake tick too
    finally:
        producer.close()
    if sent.partition is None:  # the clock moved below one unit: the near-term path took it
        return format_cancel_id(sent.message_id), sent.topic
    return format_parked_id(sent.message_id, sent.partition), sent.topic


@delayed.command("cancel")
@click.argument("message_id", metavar="ID")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=CANCEL_WAIT_S, show_default=True,
              help="Seconds to wait for the writer's answer.")
@click.option("--no-wait", is_flag=True, help="Send the cancel and exit 0 without waiting for the answer.")
@_syncer_option
@_writer_options
def cancel(message_id: str, timeout: float, no_wait: bool, syncer_config: Optional[str], service_url: str,
           writer_config: Optional[str], scheduling_topic: Optional[str], connect_timeout: float) -> None:
    """Cancel the delayed message `delayed send` printed ID for, and say what happened.

    Waits (up to --timeout) for the writer's answer. Exit status: 0 cancelled (it will not be
    delivered); 3 already delivered (a cancel cannot call it back); 4 not known: no message with
    this id is indexed (a mistyped id, another writer's, or one still on its way: the writer keeps
    the cancel in case it arrives); 5 no answer within --timeout
    (the cancel was sent: the writer applies it when it reads it). --no-wait exits 0 once sent.
    A parked message's id (`...@dl<k>`) is cancelled through the syncer, which answers nothing:
    it drops the message when it reaches it (or passes the cancel on to the writer if it was
    forwarded already); exit 0 once sent.
    """
    parked = parse_parked_id(message_id)
    if parked is not None:
        check_service_url("--service-url", service_url)
        _cancel_parked(message_id, parked, syncer_config, service_url, connect_timeout)
        return
    import pulsar

    from ..runtime.connect import open_client
    from ..scheduling_protocol import cancel_reply_topic
    from ..timing import DelayedProducer
    from ..topics import TopicName

    ref, partition = parse_cancel_id(message_id)
    check_service_url("--service-url", service_url)
    terms = writer_terms(writer_config, scheduling_topic)
    if terms.partitions and not 0 <= partition < terms.partitions:
        raise click.BadParameter(f"{message_id}: the writer reads {terms.partitions} partitions of "
                                 f"{terms.scheduling_topic}: give the id `delayed send` printed, with "
                                 f"@<partition> 0..{terms.partitions - 1}", param_hint="ID")
    topic = partition_name(terms.scheduling_topic, partition) if partition >= 0 else terms.scheduling_topic
    reply_topic = cancel_reply_topic(TopicName.from_client(topic).full_name)
    client = open_client(client_settings(service_url), connect_timeout)
    reader = None
    producer = DelayedProducer(client, backend="scheduler", scheduling_topic=topic)
    try:
        if not no_wait:  # reading from the end before the cancel is sent: its answer comes after
            reader = client.create_reader(reply_topic, pulsar.MessageId.latest)
        sent = producer.cancel(pulsar.MessageId(partition, ref.ledger_id, ref.entry_id, ref.batch_index),
                               reply_to=reply_topic)
        log.info("event=delayed_cancel_sent id=%s scheduling_topic=%s", message_id, topic)
        if reader is None:
            click.echo(f"cancel of {message_id} sent to {topic}", err=True)
            return
        outcome = wait_cancel_outcome(reader, MessageRef.of(sent), timeout)
    finally:
        if reader is not None:
            reader.close()
        producer.close()
        client.close()
    text, code = describe_cancel_outcome(message_id, outcome, timeout)
    click.echo(text)
    if code:
        raise SystemExit(code)


def _cancel_parked(message_id: str, parked: Tuple[MessageRef, int], syncer_config: Optional[str], service_url: str,
                   connect_timeout: float) -> None:
    """The cancel of a parked message: to `<delay-level topic>-CANCEL`, as DelayLevelProducer.cancel sends it."""
    from ..delaylevel.rule import CANCEL_PARTITION_PROP, cancel_topic
    from ..runtime.connect import open_client
    from ..scheduling_protocol import CANCEL_PROP

    syncer = syncer_terms(syncer_config)
    if syncer is None:
        raise click.BadParameter(f"{message_id} is a parked message's id: give the syncer's config "
                                 f"(no {DEFAULT_SYNCER_CONFIG} here)", param_hint="--syncer-config")
    ref, level = parked
    if level >= syncer.strategy.partitions:
        raise click.BadParameter(f"{message_id}: the syncer has {syncer.strategy.partitions} delay-level partitions, "
                                 f"not {level + 1}", param_hint="ID")
    topic = cancel_topic(syncer.delay_level_topic)
    client = open_client(client_settings(service_url), connect_timeout)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"", properties={CANCEL_PROP: ref.format_cancel(), CANCEL_PARTITION_PROP: str(level)})
        producer.close()
    finally:
        client.close()
    log.info("event=delayed_cancel_sent id=%s cancel_topic=%s", message_id, topic)
    click.echo(f"{message_id}: cancel sent to {topic}; the syncer drops the message when it reaches it (it "
               "answers nothing: `inspect syncer` shows what it still holds)")


def wait_cancel_outcome(reader: Any, cancel_ref: MessageRef, timeout_s: float) -> Optional[Tuple[str, str]]:
    """(outcome, seconds the writer keeps an unknown id's cancel or "") the writer answered for
    the cancel at `cancel_ref`, or None after `timeout_s`."""
    import time

    import pulsar

    from ..scheduling_protocol import CANCEL_KEPT_PROP, CANCEL_OUTCOME_PROP, ORIGIN_MSG_ID_PROP

    deadline = time.monotonic() + timeout_s
    while True:
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            return None
        try:
            msg = reader.read_next(timeout_millis=min(left_ms, 1000))
        except pulsar.Timeout:
            continue
        props = msg.properties()
        try:
            origin = MessageRef.parse(props.get(ORIGIN_MSG_ID_PROP, ""))
        except ProtocolError:
            continue  # not an answer (nothing else is sent there)
        if (origin.ledger_id, origin.entry_id, max(origin.batch_index, 0)) == (
                cancel_ref.ledger_id, cancel_ref.entry_id, max(cancel_ref.batch_index, 0)):
            return props.get(CANCEL_OUTCOME_PROP, ""), props.get(CANCEL_KEPT_PROP, "")


def describe_cancel_outcome(message_id: str, answer: Optional[Tuple[str, str]], timeout_s: float) -> Tuple[str, int]:
    """(the line `delayed cancel` prints, its exit status) for the writer's answer."""
    outcome, kept = answer if answer is not None else (None, "")
    if outcome == "cancelled":
        return f"{message_id}: cancelled; it will not be delivered", EXIT_CANCELLED
    if outcome == "already_released":
        return f"{message_id}: already delivered; a cancel cannot call it back", EXIT_ALREADY_RELEASED
    if outcome == "not_known_yet":
        keeps = f"for {kept} s" if kept else "for a while"
        return (f"{message_id}: not known (yet): the writer has indexed no message with this id (a mistyped id, or "
                f"another writer's?). It keeps the cancel {keeps} (unknownCancelRetentionSeconds) in case the "
                "message is still on its way, and drops the message if it comes by then", EXIT_NOT_KNOWN)
    if outcome is None:
        return (f"{message_id}: no answer from the writer within {timeout_s:g} s (is it running? `inspect writer`); "
                "the cancel was sent and is applied when the writer reads it", EXIT_NO_ANSWER)
    return f"{message_id}: the writer answered {outcome!r}, which this version does not know", EXIT_NO_ANSWER
