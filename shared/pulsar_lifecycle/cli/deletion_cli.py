"""`pulsar-lifecycle deletion ...`: operator commands for two-phase ledger deletion.

  deletion enqueue        one ledger (BookKeeper or offloaded) for two-phase deletion
  deletion enqueue-topic  every ledger internalStats lists for a topic
  deletion dlq list       dead letters not yet replayed (JSON lines)
  deletion dlq replay     send dead letters back to the deletion topic with a fresh retry budget
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import click

from ..config.settings import defaults_of
from ..deletion.config import DeletionConfig
from ..deletion.model import (
    InvalidRequestError,
    LedgerComponent,
    LedgerContext,
    LedgerType,
    OffloadContext,
    PendingDeleteLedgerInfo,
    TopicRef,
)
from ..deletion.topics import SCOPES, DeletionTopics
from .args import connect_timeout_option
from .client_options import client_options, conf_default
from .up_manifest import running_function


def _topics(opts: Dict[str, Any]) -> DeletionTopics:
    try:
        return DeletionTopics(namespace=opts["namespace"], topic_name=opts["topic_name"],
                              parallelism=opts["parallelism"], scope=opts["scope"],
                              tenant_namespace=opts["tenant_namespace"])
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


# The options that mirror the worker's userConfig keys take its defaults (declared once, in DeletionConfig).
_WORKER = defaults_of(DeletionConfig)
DEFAULT_WORKER_CONFIG = "function-configs/ledger-deletion-worker.yaml"
DEFAULT_DATA_DIR = ".pulsar-lifecycle"
WORKER_CLASS = "ledger_deletion_worker.LedgerDeletionWorker"


@dataclass(frozen=True)
class WorkerTerms:
    """The LedgerDeletionWorker's userConfig as the requests will meet it, and where it came from."""

    source: str
    user_config: Dict[str, Any]
    embedded: bool = False  # run by `up` on its embedded broker (pulsar-lite)
    # True for --worker-config and a running `up`'s: what the worker runs with. The shipped
    # config found by default only gives the delay defaults (a deployed worker may differ).
    authoritative: bool = True


def worker_terms(worker_config: Optional[str], data_dir: str, service_url: Optional[str]) -> Optional[WorkerTerms]:
    """The worker's terms: --worker-config; else the worker a running `up` with `data_dir` runs on
    `service_url` (its manifest, up_manifest.py: as it runs, e.g. without the URLs
    pulsar-lite lacks); else the shipped config when present; else None (not known)."""
    if worker_config is None and service_url:
        running = running_function(Path(data_dir), service_url, WORKER_CLASS)
        if running is not None:
            where = "up's embedded broker" if running.embedded else service_url
            return WorkerTerms(f"the LedgerDeletionWorker `up` runs on {where} ({running.config})",
                               running.user_config, running.embedded)
    from .args import function_config_option

    found = function_config_option(worker_config, DEFAULT_WORKER_CONFIG, "--worker-config")
    if found is None:
        return None
    path, spec = found
    if spec.class_name != WORKER_CLASS:
        raise click.BadParameter(f"{path} is a {spec.class_name} config, not a LedgerDeletionWorker's",
                                 param_hint="--worker-config")
    return WorkerTerms(str(path), dict(spec.user_config or {}), authoritative=worker_config is not None)


def resolve_delay(backend: Optional[str], scheduling_topic: Optional[str],
                  terms: Optional[WorkerTerms]) -> tuple:
    """(delay backend, scheduling topic): the options, else the worker's delayBackend and
    schedulingTopic (its phase-one delays then go where its own do), else the broker backend."""
    user = terms.user_config if terms is not None else {}
    if backend is None:
        backend = str(user.get("delayBackend", _WORKER["delayBackend"])) if terms is not None else "broker"
    if scheduling_topic is None and backend == "scheduler":
        scheduling_topic = user.get("schedulingTopic") or None
    return backend, scheduling_topic


def serving_problems(info: PendingDeleteLedgerInfo, user: Dict[str, Any]) -> List[str]:
    """Why a worker with userConfig `user` cannot serve `info` (it would dead-letter it): a
    missing in-use oracle or storage for the request's component and type; [] when it can."""
    if info.ledger_component is LedgerComponent.DELAYED_INDEX_BUCKET:
        if not user.get("bucketSnapshotHooks"):
            return ["no bucketSnapshotHooks: no in-use oracle or store for DELAYED_INDEX_BUCKET (the writer's "
                    "snapshots)"]
        return []
    out = []
    if info.check_ledger_still_in_use and not user.get("pulsarAdminUrl"):
        out.append(f"no pulsarAdminUrl: no in-use oracle for {info.ledger_component.value} ledgers (internalStats)")
    if info.ledger_type is LedgerType.OFFLOAD_LEDGER:
        if not any(user.get(k) for k in ("s3Bucket", "s3AllowedBuckets", "s3EndpointUrl", "filesystemBasePath")):
            out.append("no s3Bucket / s3AllowedBuckets / s3EndpointUrl / filesystemBasePath: it cannot delete "
                       "offloaded ledgers")
    elif not user.get("bookieHttpUrls"):
        out.append("no bookieHttpUrls: it cannot delete BookKeeper ledgers")
    return out


def refuse_unservable(info: PendingDeleteLedgerInfo, terms: Optional[WorkerTerms]) -> None:
    """click.ClickException, before anything is sent, when the worker would dead-letter `info`."""
    if terms is None or not terms.authoritative:
        return
    problems = serving_problems(info, terms.user_config)
    if not problems:
        return
    hint = ("pulsar-lite has no admin REST API and no bookies, so `up` runs the worker without pulsarAdminUrl "
            "and bookieHttpUrls: on the embedded broker only DELAYED_INDEX_BUCKET requests (with "
            "bucketSnapshotHooks) can be served; run against a Pulsar cluster (`up --broker-service-url`) whose "
            "worker config sets them" if terms.embedded
            else "set them in the worker's userConfig (docs/deletion.md), or pass --worker-config with the one it runs")
    raise click.ClickException(f"ledger {info.ledger_id} NOT enqueued ({info.ledger_component.value}, "
                               f"{info.ledger_type.value}): {terms.source} would dead-letter it: {'; '.join(problems)}. "
                               f"{hint}")


def _client(url: str, connect_timeout_s: Optional[float] = None) -> Any:
    """A client of `url` once its broker accepts connections and answers the protocol (waits
    for a broker that comes up late).

    Raises BrokerError naming the URL and the time waited instead of letting every producer
    time out on its own.
    """
    from ..runtime.connect import open_client
    from .client_options import client_settings

    return open_client(client_settings(url), connect_timeout_s)


def _check_connection_options(opts: Dict[str, Any]) -> DeletionTopics:
    """The deletion topics and the service URL, checked before anything connects."""
    from .args import check_service_url

    if not opts.get("service_url"):
        raise click.BadParameter("a broker URL is needed (pulsar://host:6650)", param_hint="--service-url")
    check_service_url("--service-url", opts["service_url"])
    return _topics(opts)


def _check_delay(delay_seconds: int, backend: str, scheduling_topic: Optional[str]) -> None:
    """The phase-one delay options, checked before anything connects."""
    from .args import check_topic

    if delay_seconds < 0:
        raise click.BadParameter(f"must be >= 0, got {delay_seconds}", param_hint="--send-delay-seconds")
    if delay_seconds > 0 and backend == "scheduler":
        if not scheduling_topic:
            raise click.BadParameter("the scheduler delay backend needs --scheduling-topic",
                                     param_hint="--scheduling-topic")
        check_topic("--scheduling-topic", scheduling_topic)


def _pending_info(topic: str, ledger_id: int, ctx: Optional[LedgerContext], component: str, ltype: LedgerType,
                  check_in_use: bool, properties: Optional[Dict[str, str]], topics: DeletionTopics) -> PendingDeleteLedgerInfo:
    """The request `deletion enqueue` sends, built (and so checked) before anything connects."""
    from ..config.validate import topic_problem

    try:
        ref = TopicRef.parse(topic)
        problem = topic_problem(ref.full_name)
        if problem:
            raise InvalidRequestError(problem)
        info = PendingDeleteLedgerInfo(ref.short_name, LedgerComponent(component), ltype, ledger_id, ctx,
                                       check_in_use, dict(properties or {}))
        topics.tenant_of_request(info.topic)  # tenant scope: the tenant must be one with deletion topics
    except (InvalidRequestError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="--topic/--ledger-id") from exc
    return info


def close_service(service: Any, client: Any) -> None:
    """Close in order: the DelayedProducer's producers, the service's producers, then the client.

    A producer left open when the client closes is destroyed at interpreter exit, while
    pulsar-client's C++ threads are still being torn down: that is the intermittent
    "terminate called without an active exception" (SIGABRT) after a successful send.
    """
    delayed = getattr(service, "delayed", None) if service is not None else None
    for step in (getattr(delayed, "close", None), getattr(service, "close", None), getattr(client, "close", None)):
        if step is None:
            continue
        try:
            step()
        except Exception as exc:  # keep closing the rest; the client must be closed last whatever happens
            logging.getLogger(__name__).warning("event=close_failed step=%s error=%r", getattr(step, "__qualname__", step), exc)


def deletion_topic_options(f: Any, service_url_required: bool = True) -> Any:
    """The deletion-topic options (shared with `spark orphans --enqueue`)."""
    f = click.option("--service-url", required=service_url_required, default=conf_default("brokerServiceUrl"),
                     help="pulsar:// or pulsar+ssl:// URL of the broker [default: brokerServiceUrl of the client.conf].")(f)
    f = client_options(f)
    f = click.option("--namespace", default=_WORKER["deletionNamespace"], show_default=True, help="deletionNamespace.")(f)
    f = click.option("--topic-name", default=_WORKER["deletionTopicName"], show_default=True, help="deletionTopicName.")(f)
    f = click.option("--parallelism", type=int, default=_WORKER["ledgerDeletionParallelism"], show_default=True,
                     help="ledgerDeletionParallelism.")(f)
    f = click.option("--scope", type=click.Choice(SCOPES), default=_WORKER["deletionTopicScope"], show_default=True,
                     help="deletionTopicScope.")(f)
    f = click.option("--tenant-namespace", default=_WORKER["tenantDeletionNamespace"], show_default=True,
                     help="tenantDeletionNamespace.")(f)
    return f


def _topic_options(f: Any) -> Any:
    return deletion_topic_options(f)


def build_service(opts: Dict[str, Any], delay_seconds: int, backend: Optional[str], scheduling_topic: Optional[str],
                  connect_timeout_s: Optional[float] = None, worker: Optional[WorkerTerms] = None) -> Any:
    """(LedgerDeletionService, client) for the parsed deletion-topic and delay options; a backend
    of None is the worker's (`worker`, else found by worker_terms), see resolve_delay.

    Close both with close_service(service, client)."""
    from ..deletion.service import LedgerDeletionService
    from ..timing import DelayedProducer

    topics = _check_connection_options(opts)  # bad options fail before any connection is made
    if backend is None:
        terms = worker if worker is not None else worker_terms(None, DEFAULT_DATA_DIR, opts.get("service_url"))
        backend, scheduling_topic = resolve_delay(None, scheduling_topic, terms)
    _check_delay(delay_seconds, backend, scheduling_topic)
    client = _client(opts["service_url"], connect_timeout_s)
    delayed = None
    try:
        if delay_seconds > 0:
            try:
                delayed = DelayedProducer(client, backend=backend, scheduling_topic=scheduling_topic)
            except ValueError as exc:
                raise click.BadParameter(str(exc)) from exc
        return LedgerDeletionService(client, topics, delayed, send_delay_seconds=delay_seconds), client
    except BaseException:
        if delayed is not None:
            delayed.close()
        client.close()
        raise


def delay_options(f: Any) -> Any:
    """The phase-one send-delay options (shared with `spark orphans --enqueue`)."""
    f = click.option("--send-delay-seconds", type=int, default=_WORKER["sendDelaySeconds"], show_default=True,
                     help="sendDelaySeconds; 0 sends at once.")(f)
    f = click.option("--delay-backend", type=click.Choice(["broker", "scheduler"]), default=None,
                     help="How sendDelaySeconds is applied [default: the worker's delayBackend (its config, or what "
                          "a running `up` runs), else broker].")(f)
    f = click.option("--scheduling-topic", default=None,
                     help="The scheduler's input topic (scheduler backend) [default: the worker's schedulingTopic].")(f)
    return f


@click.group("deletion")
def deletion() -> None:
    """Two-phase ledger deletion (PIP-186): enqueue ledgers, inspect and replay the DLQ."""


@deletion.command("enqueue")
@_topic_options
@delay_options
@click.option("--topic", required=True, help="Owning topic, tenant/ns/topic[-partition-N].")
@click.option("--ledger-id", type=int, required=True)
@click.option("--component", type=click.Choice([c.value for c in LedgerComponent]), default="MANAGED_LEDGER", show_default=True)
@click.option("--offload-uuid", default=None, help="Offload UUID: makes this an OFFLOAD_LEDGER request.")
@click.option("--offload-driver", default=None, help="Offload driver name (aws-s3, filesystem, ...).")
@click.option("--offload-bucket", default=None, help="Bucket of an S3 offload (driver metadata 'bucket').")
@click.option("--cursor", default=None, help="Cursor name of a MANAGED_CURSOR ledger (checked against metadata).")
@click.option("--skip-in-use-check", is_flag=True, help="checkLedgerStillInUse=false.")
@connect_timeout_option
@click.option("--worker-config", default=None,
              help="The LedgerDeletionWorker's config YAML [default: the worker a running `up` with --data-dir runs "
                   f"on --service-url, else {DEFAULT_WORKER_CONFIG} when present]: its delay backend, and whether it "
                   "can serve the request.")
@click.option("--data-dir", default=DEFAULT_DATA_DIR, show_default=True,
              help="The --data-dir of a running `up` (where it says what it runs).")
def enqueue(topic: str, ledger_id: int, component: str, offload_uuid: Optional[str], offload_driver: Optional[str],
            offload_bucket: Optional[str], cursor: Optional[str], skip_in_use_check: bool, connect_timeout: Optional[float],
            worker_config: Optional[str], data_dir: str, send_delay_seconds: int, delay_backend: Optional[str],
            scheduling_topic: Optional[str], **opts: Any) -> None:
    """Enqueue one ledger for two-phase deletion.

    Refused before anything is sent when the worker (--worker-config, or what a running `up`
    runs) has no in-use oracle or storage for the request: it would dead-letter it.
    """
    ctx = None
    ltype = LedgerType.LEDGER
    if offload_uuid:
        meta = {"bucket": offload_bucket} if offload_bucket else {}
        try:
            oc = OffloadContext.from_uuid(offload_uuid, driver_name=offload_driver, driver_metadata=meta)
        except ValueError as exc:
            raise click.BadParameter(f"--offload-uuid: {exc}") from exc
        ctx, ltype = LedgerContext(ledger_id, offload_context=oc), LedgerType.OFFLOAD_LEDGER
    from ..deletion.service import PendingDeleteSendError

    info = _pending_info(topic, ledger_id, ctx, component, ltype, not skip_in_use_check,
                         {"cursor": cursor} if cursor else None, _check_connection_options(opts))
    terms = worker_terms(worker_config, data_dir, opts.get("service_url"))
    refuse_unservable(info, terms)
    delay_backend, scheduling_topic = resolve_delay(delay_backend, scheduling_topic, terms)
    service, client = build_service(opts, send_delay_seconds, delay_backend, scheduling_topic, connect_timeout)
    try:
        mid = service.append(info)
    except InvalidRequestError as exc:
        raise click.BadParameter(str(exc)) from exc
    except PendingDeleteSendError as exc:
        raise click.ClickException(f"ledger {ledger_id} NOT enqueued (broker {opts['service_url']}): {exc}") from exc
    finally:
        close_service(service, client)
    click.echo(json.dumps({"topic": topic, "ledgerId": ledger_id, "component": component, "type": ltype.value,
                           "messageId": str(mid)}))


@deletion.command("enqueue-topic")
@_topic_options
@delay_options
@click.option("--topic", required=True, help="Topic whose every ledger is enqueued.")
@click.option("--admin-url", required=True, default=conf_default("webServiceUrl"),
              help="Pulsar admin URL (http://broker:8080, https://... on a secured cluster) for internalStats, "
                   "called with the token and TLS trust of the connection options [default: webServiceUrl of "
                   "the client.conf].")
@click.option("--skip-in-use-check", is_flag=True, help="checkLedgerStillInUse=false (the topic is being deleted).")
def enqueue_topic(topic: str, admin_url: str, skip_in_use_check: bool, send_delay_seconds: int, delay_backend: str,
                  scheduling_topic: Optional[str], **opts: Any) -> None:
    """Enqueue every ledger of a topic (data, cursor and schema ledgers) for two-phase deletion."""
    from ..deletion.admin import AdminAccess, PulsarAdminClient
    from ..deletion.operator import enqueue_topic_ledgers
    from ..runtime.client_conf import token_of, token_role
    from .args import check_http_url
    from .client_options import client_settings

    admin_url = check_http_url("--admin-url", admin_url) or admin_url
    settings = client_settings(opts.get("service_url"))
    access = AdminAccess.of_client(admin_url, token=token_of(settings), role=token_role(settings),
                                   ca_path=settings.tls_trust_cert_path, insecure=settings.tls_allow_insecure)
    try:
        TopicRef.parse(topic)
    except InvalidRequestError as exc:
        raise click.BadParameter(str(exc), param_hint="--topic") from exc
    service, client = build_service(opts, send_delay_seconds, delay_backend, scheduling_topic)
    try:
        done = enqueue_topic_ledgers(service, PulsarAdminClient.connect([admin_url], access=access), topic,
                                     not skip_in_use_check)
    except (ValueError, InvalidRequestError) as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        close_service(service, client)
    for info in done:
        click.echo(json.dumps({"topic": info.topic_name, "ledgerId": info.ledger_id, "component": info.ledger_component.value}))


@deletion.group("dlq")
def dlq() -> None:
    """The dead-letter topic."""


@dlq.command("list")
@_topic_options
@click.option("--tenant", default=None, help="Whose DLQ (tenant scope).")
@click.option("--max", "max_messages", type=int, default=1000, show_default=True)
@click.option("--idle-timeout", type=float, default=2.0, show_default=True, help="Stop after this many idle seconds.")
@connect_timeout_option
def dlq_list(tenant: Optional[str], max_messages: int, idle_timeout: float, connect_timeout: Optional[float], **opts: Any) -> None:
    """Print dead letters not yet replayed, one JSON object per line."""
    from ..deletion.operator import list_dlq

    topics = _check_connection_options(opts)
    client = _client(opts["service_url"], connect_timeout)
    try:
        for entry in list_dlq(client, topics, tenant, max_messages, idle_timeout):
            click.echo(json.dumps(entry.as_dict()))
    finally:
        client.close()


@dlq.command("replay")
@_topic_options
@click.option("--tenant", default=None, help="Whose DLQ (tenant scope).")
@click.option("--max", "max_messages", type=int, default=1000, show_default=True)
@click.option("--idle-timeout", type=float, default=2.0, show_default=True)
@click.option("--ledger-id", type=int, default=None, help="Only this ledger.")
@click.option("--reason-contains", default=None, help="Only dead letters whose reason contains this text.")
@connect_timeout_option
def dlq_replay(tenant: Optional[str], max_messages: int, idle_timeout: float, ledger_id: Optional[int],
               reason_contains: Optional[str], connect_timeout: Optional[float], **opts: Any) -> None:
    """Send dead letters back to the deletion topic with a fresh retry budget."""
    from ..deletion.operator import replay_dlq

    def select(entry: Any) -> bool:
        if ledger_id is not None and entry.ledger_id != ledger_id:
            return False
        return reason_contains is None or reason_contains in entry.reason

    topics = _check_connection_options(opts)
    client = _client(opts["service_url"], connect_timeout)
    try:
        done = replay_dlq(client, topics, tenant, max_messages, idle_timeout, select)
    finally:
        client.close()
    for entry in done:
        click.echo(json.dumps(entry.as_dict()))
    click.echo(f"replayed {len(done)}", err=True)
