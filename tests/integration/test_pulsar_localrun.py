"""The writer under Apache Pulsar's own local run mode, run as docs/operations.md ("Pulsar's local
run mode") writes it: `pulsar-admin functions localrun` (pulsar-client-tools and
`pulsar-functions-local-runner-original` 4.0.8 from Maven Central,
runtime/pulsar_release.resolve_local_runner) with Pulsar's Python instance (the one the suite's
real function worker runs, support/real_worker.python_instance_dir, under
`$PULSAR_HOME/instances/python-instance/`), against the real standalone.

The docs' zip block and the writer's command line are taken from the docs and run by bash as
written; only the cluster's addresses, the zip's directory and the metrics port are this test's
(the hosts the docs name do not exist here), and the checkout's bucket-snapshot-writer.yaml is the
shipped one with topics and name of this test's own.

Checked: the delayed messages are released once and none early; SIGINT stops the runner and
its instance with no WARNING, ERROR or traceback in the function's log (the writer thread meets
a closed client at the stop: scheduler_thread_stopped, INFO); a second localrun with the same
command releases what was pending at the stop, once, none early.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pulsar
import pytest
import yaml

from pulsar_lifecycle.config.function_config import load_function_config
from pulsar_lifecycle.runtime.pulsar_release import cache_root, resolve, resolve_local_runner
from pulsar_lifecycle.runtime.pulsar_standalone import PulsarStandalone
from pulsar_lifecycle.timing import DelayedProducer
from support.broker_fixtures import broker_kinds
from support.docs_blocks import doc_blocks
from support.paths import REPO
from support.real_worker import python_instance_dir, worker_env

REASON = "Pulsar's local runner needs a real broker and its BookKeeper table service"
pytestmark = [pytest.mark.integration, pytest.mark.pulsar_only(REASON),
              pytest.mark.skipif("pulsar" not in broker_kinds(), reason=f"not on lite: {REASON}")]

OPERATIONS = REPO / "docs" / "operations.md"
HEADING = "## Pulsar's local run mode"
# What the docs' commands name, and what this test runs them against.
DOC_BROKER, DOC_STATE, DOC_ADMIN = "pulsar://broker-1:6650", "bk://bookie-1:4181", "http://broker-1:8080"
DOC_ZIP_DIR, DOC_HOME = "/srv/pl-localrun", "/srv/pl-pulsar-home"
CHECKOUT = (".venv", "pyproject.toml", "shared", "functions")


def _section_blocks() -> List[str]:
    """The bash blocks of the docs' local-run section, in order."""
    lines = OPERATIONS.read_text().splitlines()
    start = lines.index(HEADING) + 1
    end = next((i + 1 for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines) + 1)
    blocks = [b.text for b in doc_blocks("bash", [OPERATIONS]) if start < b.line < end]
    assert len(blocks) >= 2, f"the section {HEADING!r} has {len(blocks)} bash blocks; want the zip's and the commands'"
    return blocks


def documented_writer_command() -> Tuple[str, str, str]:
    """(the zip block, the PULSAR_HOME block, the writer's command line with its continuations
    joined)."""
    blocks = _section_blocks()
    assert len(blocks) == 3, f"the section {HEADING!r} has {len(blocks)} bash blocks; want the zip's, the " \
                             "commands' and PULSAR_HOME's"
    zip_block, commands, home_block = blocks
    lines = [ln.strip() for ln in commands.replace("\\\n", " ").splitlines() if ln.strip()]
    writer = [ln for ln in lines if "function-configs/bucket-snapshot-writer.yaml" in ln]
    assert len(writer) == 1, lines
    return zip_block, home_block, writer[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _checkout(tmp: Path, unique: str) -> Tuple[Path, Dict[str, str]]:
    """The repository layout with a writer config of this test's own (topics, name)."""
    project = tmp / "checkout"
    (project / "function-configs").mkdir(parents=True)
    for name in CHECKOUT:
        (project / name).symlink_to(REPO / name)
    cfg = load_function_config(REPO / "function-configs" / "bucket-snapshot-writer.yaml")
    ns = "persistent://public/default"
    names = {"ticks": f"{ns}/lr-ticks-{unique}", "sched": f"{ns}/lr-sched-{unique}",
             "output": f"{ns}/lr-released-{unique}", "name": f"lr-writer-{unique}"}
    specs = list(cfg["inputSpecs"].values())
    cfg.update(name=names["name"], output=names["output"], inputSpecs={names["ticks"]: specs[0], names["sched"]: specs[1]})
    cfg["userConfig"] = dict(cfg["userConfig"], tickTopic=names["ticks"], schedulingTopic=names["sched"])
    (project / "function-configs" / "bucket-snapshot-writer.yaml").write_text(yaml.safe_dump(cfg))
    return project, names


class Released:
    """The writer's output topic, read from before anything is sent: payload -> publish times."""

    def __init__(self, client: pulsar.Client, topic: str) -> None:
        self.consumer = client.subscribe(topic, f"lr-check-{uuid.uuid4().hex[:6]}",
                                         initial_position=pulsar.InitialPosition.Earliest)
        self.got: List[Tuple[str, int]] = []

    def drain(self, want: int, timeout_s: float, run: Optional["LocalRun"] = None) -> None:
        """Until `want` received or `timeout_s`; AssertionError at once when `run` has exited."""
        deadline = time.monotonic() + timeout_s
        while len(self.got) < want and time.monotonic() < deadline:
            if run is not None and run.proc.poll() is not None:
                raise AssertionError(f"localrun exited {run.proc.returncode}: {run.tail()}")
            try:
                m = self.consumer.receive(timeout_millis=500)
            except pulsar.Timeout:
                continue
            self.got.append((m.data().decode(), m.publish_timestamp()))
            self.consumer.acknowledge(m)


def _send(client: pulsar.Client, sched: str, output: str, prefix: str, count: int, first_due_ms: int) -> Dict[str, int]:
    producer = DelayedProducer(client, scheduling_topic=sched)
    due = {f"{prefix}-{i}": first_due_ms + 100 * i for i in range(count)}
    try:
        for payload, at in due.items():
            producer.send_async(output, payload.encode(), at, lambda res, mid: None)
        producer.flush()
    finally:
        producer.close()
    return due


class LocalRun:
    """One `pulsar-admin functions localrun` as the docs write it, its output in a file."""

    def __init__(self, script: str, project: Path, env: Dict[str, str], out: Path, background: bool = False) -> None:
        """`background`: started as a script's background job is (`cmd &` without job control),
        with SIGINT ignored; otherwise as the foreground job of a terminal, with SIGINT at its
        default whatever this test process inherited (a CI runner may itself run in the background)."""
        self.out = out
        sigint = signal.SIG_IGN if background else signal.SIG_DFL
        with open(out, "ab") as f:
            self.proc = subprocess.Popen(["bash", "-e", "-c", script], cwd=project, env=env, stdout=f,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))
        self.started = time.monotonic()

    def interrupt(self, timeout_s: float = 150.0, sig: int = signal.SIGINT) -> Tuple[int, float]:
        """`sig` to the runner's process group (pulsar-admin, the runner JVM, and its instances);
        SIGINT is Ctrl-C as a terminal sends it: (pulsar-admin's exit code, seconds until it exited)."""
        t0 = time.monotonic()
        os.killpg(self.proc.pid, sig)
        try:
            rc = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            dumps = self.thread_dumps()
            self.kill()
            raise AssertionError(f"localrun still running {timeout_s:.0f} s after {signal.Signals(sig).name} "
                                 f"(thread dumps of its JVMs in {dumps}): {self.tail()}") from None
        return rc, time.monotonic() - t0

    def thread_dumps(self) -> Path:
        """`jcmd <pid> Thread.print` of every JVM of the group, into a file beside the output: what
        a runner that does not stop after SIGINT is waiting on."""
        path = self.out.with_suffix(".threads.txt")
        with open(path, "w") as f:
            for pid in _group_pids(self.proc.pid):
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if not cmdline or not cmdline[0].endswith(b"java"):
                    continue
                res = subprocess.run(["jcmd", str(pid), "Thread.print"], capture_output=True, text=True, timeout=60)
                f.write(f"== {pid} {b' '.join(cmdline[:3]).decode(errors='replace')}\n{res.stdout}{res.stderr}\n")
        return path

    def group_left(self, timeout_s: float = 20.0) -> bool:
        """True once no process of the group is left (the runner JVM, the instances)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return True
            time.sleep(0.2)
        return False

    def kill(self) -> None:
        """SIGKILL what is left of the process group (a failed test)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def tail(self) -> str:
        return self.out.read_text(errors="replace")[-4000:]


def _group_pids(pgid: int) -> List[int]:
    """The processes of process group `pgid` (from /proc)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid:  # after the command: state, ppid, pgrp
            pids.append(int(stat.parent.name))
    return pids


def _function_logs(home: Path, name: str) -> List[Path]:
    """The instance's log where the docs say it is, [] before it exists."""
    path = home / "logs" / "functions" / "public" / "default" / name / f"{name}-0.log"
    return [path] if path.is_file() else []


def _trouble(text: str) -> List[str]:
    return [ln for ln in text.splitlines() if re.search(r"\b(WARNING|ERROR|CRITICAL)\b|Traceback", ln)]


def _check(released: Released, due: Dict[str, int]) -> None:
    counts: Dict[str, int] = {}
    for payload, _at in released.got:
        counts[payload] = counts.get(payload, 0) + 1
    missing = sorted(set(due) - set(counts))
    twice = sorted(p for p, n in counts.items() if n > 1)
    early = sorted(f"{p} {due[p] - at} ms" for p, at in released.got if p in due and at < due[p])
    assert not missing and not twice and not early, (
        f"missing {len(missing)} {missing[:5]}, twice {len(twice)} {twice[:5]}, early {len(early)} {early[:5]}")


@pytest.mark.timeout(420)
def test_the_writer_under_pulsar_admin_functions_localrun_as_documented(pulsar_broker: PulsarStandalone,
                                                                         tmp_path: Path) -> None:
    unique = uuid.uuid4().hex[:8]
    project, names = _checkout(tmp_path, unique)
    zip_dir = tmp_path / "pl-localrun"
    zip_block, home_block, writer_script = documented_writer_command()
    res = subprocess.run(["bash", "-e", "-c", zip_block.replace(DOC_ZIP_DIR, str(zip_dir))], cwd=project,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    home = tmp_path / "pulsar-home"
    python_instance_dir(resolve(), home / "instances" / "python-instance")
    resolve_local_runner()  # what the scripts' classpath.txt names
    metrics_port = _free_port()
    script = "\n".join([home_block.replace(DOC_HOME, str(home)).replace(DOC_ADMIN, pulsar_broker.admin_url)
                        .replace("~/.cache/pulsar-lifecycle", str(cache_root())),
                        writer_script.replace(DOC_ZIP_DIR, str(zip_dir)).replace(DOC_BROKER, pulsar_broker.service_url)
                        .replace(DOC_STATE, pulsar_broker.state_storage_url)])
    script = re.sub(r"--metrics-port-start \d+", f"--metrics-port-start {metrics_port}", script)
    script = script.replace("\npulsar-admin functions localrun", "\nexec pulsar-admin functions localrun")
    own_zip = f"--py {zip_dir}/bucket-snapshot-writer/pulsar-lifecycle.zip "
    assert "\nexec pulsar-admin" in script and own_zip in script and pulsar_broker.service_url in script, script
    # This run's python3 first on PATH, as "The python3 it runs" asks; no PULSAR_HOME: the scripts
    # take it from where they are, as Pulsar's do.
    env = {k: v for k, v in worker_env().items() if k != "PULSAR_HOME"}

    client = pulsar.Client(pulsar_broker.service_url, operation_timeout_seconds=30)
    run = LocalRun(script, project, env, tmp_path / "localrun-1.out")
    t_start = time.monotonic()
    try:
        released = Released(client, names["output"])
        now = int(time.time() * 1000)
        due = _send(client, names["sched"], names["output"], "first", 40, now + 5_000)
        released.drain(40, timeout_s=180, run=run)
        first_after = time.monotonic() - t_start
        assert len(released.got) == 40, f"{len(released.got)} of 40 released; localrun: {run.tail()}"
        # Pending at the stop: due well after the restart's start-up.
        later = _send(client, names["sched"], names["output"], "later", 30, int(time.time() * 1000) + 45_000)
        due.update(later)
        time.sleep(4)  # the writer has them in its index (it acks each once stored)
        rc, stop_s = run.interrupt()
        assert rc in (0, 130), f"localrun exited {rc} at SIGINT: {run.tail()}"
        assert run.group_left(), "the runner or its instance still runs after pulsar-admin exited"
        released.drain(len(due), timeout_s=1)
        assert len(released.got) == 40, "the later 30 were released before the stop"
        logs = _function_logs(home, names["name"])
        assert logs, f"no function log in {home}/logs/functions/public/default/{names['name']}: {run.tail()}"
        text = "\n".join(p.read_text(errors="replace") for p in logs)
        assert "event=scheduler_thread_failed" not in text
        assert not _trouble(text), "\n".join(_trouble(text)[:20])

        # The second as a script's background job (SIGINT ignored), stopped as the docs' pitfall says:
        # SIGINT to the runner JVM alone does nothing, SIGTERM runs the same shutdown.
        run = LocalRun(script, project, env, tmp_path / "localrun-2.out", background=True)
        released.drain(len(due), timeout_s=150, run=run)
        os.kill(run.proc.pid, signal.SIGINT)  # the JVM only (pulsar-admin execs it): its instance keeps running
        time.sleep(3)
        assert run.proc.poll() is None, f"a backgrounded localrun exited {run.proc.returncode} at SIGINT"
        rc2, stop2_s = run.interrupt(sig=signal.SIGTERM)
        assert rc2 in (0, 143), f"the second localrun exited {rc2} at SIGTERM: {run.tail()}"
        assert run.group_left(), "the runner or its instance still runs after pulsar-admin exited"
    finally:
        run.kill()
        client.close()
    _check(released, due)
    text = "\n".join(p.read_text(errors="replace") for p in _function_logs(home, names["name"]))
    assert not _trouble(text), "\n".join(_trouble(text)[:20])
    print(f"pulsar-admin functions localrun: 40 released {first_after:.0f} s after the start; SIGINT exit {rc} in "
          f"{stop_s:.1f} s; the 30 pending released by the second run once, none early; backgrounded, SIGINT left it "
          f"running and its SIGTERM exit {rc2} came in "
          f"{stop2_s:.1f} s; {len(logs)} function log(s), no WARNING/ERROR/traceback")
