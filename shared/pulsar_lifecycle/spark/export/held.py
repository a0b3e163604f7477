"""What a killed exporter's consumer still holds, read with a Reader when an export resumes.

Apache Pulsar drops a closed connection's consumers and redelivers what they held to the
consumer already connected, so an export resumed after a SIGKILL receives everything. pulsar-lite
does so after a clean close, but when the connection ended with a reset (a process SIGKILLed
with unread data on its socket, the common case for an exporter busy receiving) it keeps the dead
consumer registered, with everything dispatched to it, until the broker restarts
(tests/integration/test_broker_quirks.py, `test_a_reset_connections_consumers_stay_registered`).
A resumed export would then end after `--idle-ms` without those messages.

So a resumed export (part files already in the directory) reads each topic with a non-durable
Reader, after its consumer pass, from a *floor* to the topic's end, and exports every message not
yet in a file. The floor is the furthest entry the files held at the start: the killed exporter
was dispatched messages in topic order from there on, so what it held lies above the floor, while
what the writer acknowledged before it stopped lies below (the writer must be stopped before an
export starts). A topic the files held nothing of has no floor and is not read (what a Reader
finds there could be messages the writer acknowledged).

The messages read this way cannot be acked (the dead consumer holds them): they stay on the
subscription. A later export acks them as already exported, and a writer started on the store
seeded from these files finds them in its index and acks them as duplicates when the broker
hands them out (on pulsar-lite: after it restarts).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pulsar

from ...pulsar_io.readers import Entry, close_quietly, has_more, reader_at
from ...topics import TopicName, TopicNameError

log = logging.getLogger(__name__)

READ_WAIT_MS = 2000  # a Reader that says more is available but gives nothing for this long has stalled


def topic_key(name: str) -> str:
    """A topic's full name, so that `x`, `public/default/x` and `persistent://public/default/x` agree."""
    try:
        return TopicName.from_client(name).full_name
    except TopicNameError:
        return name


def raise_floor(floors: Dict[str, Entry], topic: str, here: Entry) -> None:
    """Record that the part files hold `here` of `topic`: its floor is the furthest such entry."""
    key = topic_key(topic)
    if key not in floors or here > floors[key]:
        floors[key] = here


def read_held(client: "pulsar.Client", topic: str, floor: Entry, is_new: Callable[[Any], bool],
              export_rows: Callable[[List[Any]], None], batch_rows: int) -> Tuple[int, int]:
    """Read `topic` from the entry `floor` (inclusive) to its end with a Reader; every message for
    which `is_new(msg)` is true goes to `export_rows` (in lists of at most `batch_rows`).
    Returns (messages read, messages exported)."""
    partition = TopicName.from_client(topic).partition_index
    reader = reader_at(client, topic, floor, partition=partition)
    read, found = 0, 0
    pending: List[Any] = []
    try:
        while has_more(reader):
            try:
                msg = reader.read_next(timeout_millis=READ_WAIT_MS)
            except pulsar.Timeout:
                log.warning("event=export_held_read_stalled topic=%s read=%d reason='the Reader said more was "
                            "available and gave nothing for %d ms'", topic, read, READ_WAIT_MS)
                break
            read += 1
            mid = msg.message_id()
            if (mid.ledger_id(), mid.entry_id()) < floor or not is_new(msg):
                continue
            pending.append(msg)
            found += 1
            if len(pending) >= batch_rows:
                export_rows(pending)
                pending = []
        if pending:
            export_rows(pending)
    finally:
        close_quietly(reader, topic)
    return read, found


def read_held_all(client: "pulsar.Client", topics: Sequence[str], floors: Dict[str, Entry],
                  is_new: Callable[[Any], bool], export_rows: Callable[[List[Any]], None],
                  batch_rows: int) -> int:
    """`read_held` on every topic with a floor; returns the messages exported."""
    total = 0
    for topic in topics:
        floor: Optional[Entry] = floors.get(topic_key(topic))
        if floor is None:
            log.info("event=export_held_not_read topic=%s reason='no part file holds a message of this topic'", topic)
            continue
        t0 = time.monotonic()
        read, found = read_held(client, topic, floor, is_new, export_rows, batch_rows)
        total += found
        event = "export_held_found" if found else "export_held_none"
        (log.warning if found else log.info)(
            "event=%s topic=%s floor=%d:%d read=%d exported=%d seconds=%.1f%s", event, topic, floor[0], floor[1],
            read, found, time.monotonic() - t0,
            " reason='a killed exporter's consumer holds them (pulsar-lite keeps it until the broker restarts); "
            "they stay on the subscription, unacked'" if found else "")
    return total
