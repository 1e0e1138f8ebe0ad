"""Notifications: webhooks and local commands, each destination delivered by its own thread.

The polling loop only queues an event (`Notifier.send`); every destination has a thread of its
own (a slow or dead receiver delays neither a poll nor another destination), which retries a
failed try with exponential backoff (1 s, 2 s, 4 s, ... at most 5 min apart, MAX_ATTEMPTS tries,
within DELIVERY_DEADLINE of the first). One try ends after SEND_TIMEOUT whatever the receiver
does (a server trickling its answer a byte at a time included). Each delivery is recorded in
the watch state, so a restarted watcher neither re-sends what was delivered nor drops what was
not. A webhook's URL (a Slack hook's path is its secret) is never printed or stored: a
destination is named by scheme, host and a digest of the URL.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import os
import shlex
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from launcher.core.errors import UsageError
from launcher.core.version import __version__
from launcher.watch.events import Event
from launcher.watch.state import WatchState

MAX_ATTEMPTS = 8
FIRST_BACKOFF = 1.0
MAX_BACKOFF = 300.0
SEND_TIMEOUT = 10.0  # one webhook request, one command, from start to end
DELIVERY_DEADLINE = 900.0  # an event not delivered this long after its first try is given up
ANSWER_LIMIT = 65536  # what is read of a webhook's answer


class DeliveryError(Exception):
    """One try failed; the message says why (status, error, exit code)."""


Deliver = Callable[[Event], None]


class _PostRedirects(urllib.request.HTTPRedirectHandler):
    """307/308 repeat the POST, body and all, at the new place (RFC 9110 15.4.8/15.4.9).
    urllib's default turns a POST answered 301/302/303 into a body-less GET (and refuses
    307/308 for a POST): a receiver that only ever saw a GET would count as delivered."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: Any,
        code: int,
        msg: str,
        headers: Any,
        newurl: str,
    ) -> urllib.request.Request:
        if code in (307, 308):
            return urllib.request.Request(
                newurl, data=req.data, headers=dict(req.header_items()), method="POST"
            )
        raise urllib.error.HTTPError(
            redact_url(newurl), code, f"{msg} (a redirect that would drop the POST)", headers, fp
        )


_OPENER = urllib.request.build_opener(_PostRedirects())


def _post(request: urllib.request.Request) -> None:
    try:
        with _OPENER.open(request, timeout=SEND_TIMEOUT) as answer:
            answer.read(ANSWER_LIMIT)
    except urllib.error.HTTPError as exc:
        raise DeliveryError(f"HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise DeliveryError(str(getattr(exc, "reason", exc))) from None


def within(seconds: float, work: Callable[[], None]) -> None:
    """Run `work` on a thread of its own and wait at most `seconds` for it: a socket timeout
    bounds each read, not the whole request, and a receiver can trickle its answer forever."""
    outcome: list[BaseException | None] = []

    def attempt() -> None:
        try:
            work()
        except BaseException as exc:  # handed to the caller
            outcome.append(exc)
        else:
            outcome.append(None)

    worker = threading.Thread(target=attempt, name="watch-notify-try", daemon=True)
    worker.start()
    worker.join(seconds)
    if not outcome:
        raise DeliveryError(f"no answer within {seconds:g} s")
    if outcome[0] is not None:
        raise outcome[0]


def webhook(url: str) -> Deliver:
    """POST the event (its long lines cut, marked) as JSON; any 2xx is delivered."""

    def deliver(event: Event) -> None:
        body = json.dumps(event.capped().to_json()).encode()
        request = urllib.request.Request(
            url,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "User-Agent": f"launcher-watch/{__version__}",
            },
        )
        within(SEND_TIMEOUT, lambda: _post(request))

    return deliver


def command(argv: Sequence[str]) -> Deliver:
    """Run argv (no shell) with the event as JSON on its stdin and in LAUNCHER_EVENT_*
    variables (its long lines cut, marked: an environment string over 128 KiB fails the exec
    with "Argument list too long"); exit 0 is delivered."""

    def deliver(event: Event) -> None:
        capped = event.capped()
        env = {**os.environ, **capped.environment()}
        try:
            done = subprocess.run(
                list(argv),
                env=env,
                input=json.dumps(capped.to_json(), sort_keys=True).encode() + b"\n",
                capture_output=True,
                timeout=SEND_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DeliveryError(str(exc)) from None
        if done.returncode != 0:
            tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
            raise DeliveryError(f"exit {done.returncode} {tail[0][:200]}".strip())

    return deliver


def redact_url(url: str) -> str:
    """scheme://host[:port]/… : what may be shown of a URL (its path or query may be a token)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<an invalid URL>"
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}{port}/…"


def webhook_name(url: str) -> str:
    """A destination's name, shown and stored: the redacted URL and a digest telling two hooks
    on one host apart (and matching a restarted watcher's outbox)."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:8]
    return f"webhook {redact_url(url)} #{digest}"


def parse_webhook(url: str) -> str:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a port that is no number)
    except ValueError as exc:
        raise UsageError(f"--webhook {redact_url(url)}: not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--webhook {redact_url(url)}: not an http:// or https:// URL")
    return url


def parse_exec(text: str) -> list[str]:
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"--exec {text!r}: {exc}") from None
    if not argv:
        raise UsageError("--exec: empty command")
    return argv


@dataclass(order=True)
class _Job:
    due: float
    seq: int
    event: Event = field(compare=False)
    destination: str = field(compare=False)
    attempt: int = field(compare=False, default=1)
    first: float = field(compare=False, default=0.0)  # when its first try was due


class Notifier:
    """Queues events for every destination and delivers them, one thread per destination."""

    def __init__(
        self,
        destinations: dict[str, Deliver],
        state: WatchState,
        *,
        log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
        clock: Callable[[], float] = time.monotonic,
        first_backoff: float = FIRST_BACKOFF,
    ) -> None:
        self.destinations = destinations
        self.state = state
        self.log = log
        self.clock = clock
        self.first_backoff = first_backoff
        self._jobs: dict[str, list[_Job]] = {name: [] for name in destinations}
        self._seq = 0
        self._cond = threading.Condition()
        self._stopping = False
        self._busy = 0
        self._threads = [
            threading.Thread(target=self._loop, args=(name,), name="watch-notify", daemon=True)
            for name in destinations
        ]
        self.sent = 0
        self.failed = 0

    @property
    def names(self) -> list[str]:
        return list(self.destinations)

    def start(self) -> None:
        for event, destinations in self.state.undelivered():
            for name in destinations:
                if name in self.destinations:
                    self._queue(event, name, 1, self.clock())
                else:  # a destination this watcher was not given any more
                    self.state.delivered(event.id, name)
        for thread in self._threads:
            thread.start()

    def send(self, event: Event) -> None:
        """Queue an event (already in the state's outbox) for every destination; never blocks
        on the network."""
        now = self.clock()
        for name in self.destinations:
            self._queue(event, name, 1, now)

    def _queue(
        self, event: Event, name: str, attempt: int, due: float, first: float | None = None
    ) -> None:
        with self._cond:
            self._seq += 1
            job = _Job(due, self._seq, event, name, attempt, due if first is None else first)
            heapq.heappush(self._jobs[name], job)
            self._cond.notify_all()

    def _pending(self) -> bool:
        return any(self._jobs.values())

    def _loop(self, name: str) -> None:
        jobs = self._jobs[name]
        while True:
            with self._cond:
                while not self._stopping and (not jobs or jobs[0].due > self.clock()):
                    timeout = jobs[0].due - self.clock() if jobs else None
                    self._cond.wait(timeout)
                if self._stopping:
                    return
                job = heapq.heappop(jobs)
                self._busy += 1
            try:
                self._deliver(job)
            finally:
                with self._cond:
                    self._busy -= 1
                    self._cond.notify_all()

    def _deliver(self, job: _Job) -> None:
        try:
            self.destinations[job.destination](job.event)
        except DeliveryError as error:
            delay = min(self.first_backoff * 2 ** (job.attempt - 1), MAX_BACKOFF)
            late = self.clock() + delay - job.first > DELIVERY_DEADLINE
            if job.attempt >= MAX_ATTEMPTS or late:
                self.failed += 1
                self.log(
                    f"notify: {job.destination}: giving up on event {job.event.kind} "
                    f"after {job.attempt} tries: {error}"
                )
                self.state.delivered(job.event.id, job.destination)
                return
            self.log(
                f"notify: {job.destination}: try {job.attempt} failed ({error}); "
                f"again in {delay:g} s"
            )
            self._queue(
                job.event, job.destination, job.attempt + 1, self.clock() + delay, job.first
            )
            return
        with self._cond:
            self.sent += 1
        self.state.delivered(job.event.id, job.destination)

    def drain(self, timeout: float) -> bool:
        """Wait up to `timeout` for every queued delivery (retries too); True when none is left."""
        end = self.clock() + timeout
        with self._cond:
            while self._busy or self._pending():
                left = end - self.clock()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.1))
            return not self._pending() and not self._busy

    def stop(self, timeout: float = 5.0) -> None:
        """Deliver what is queued (within `timeout`), then stop; the rest stays in the outbox."""
        if any(thread.is_alive() for thread in self._threads):
            self.drain(timeout)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        end = time.monotonic() + SEND_TIMEOUT + 1
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=max(end - time.monotonic(), 0.0))
