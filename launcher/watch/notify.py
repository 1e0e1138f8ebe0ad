"""Notifications: webhooks and local commands, delivered by one background thread.

The polling loop only queues an event (`Notifier.send`); a thread delivers it to every
destination, retrying a failed one with exponential backoff (1 s, 2 s, 4 s, ... at most 5 min
apart, MAX_ATTEMPTS tries), so a slow or dead receiver never delays a poll. Each delivery is
recorded in the watch state, so a restarted watcher neither re-sends what was delivered nor
drops what was not.
"""

from __future__ import annotations

import heapq
import json
import shlex
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from launcher.errors import UsageError
from launcher.version import __version__
from launcher.watch.events import Event
from launcher.watch.state import WatchState

MAX_ATTEMPTS = 8
FIRST_BACKOFF = 1.0
MAX_BACKOFF = 300.0
SEND_TIMEOUT = 10.0  # one webhook request, one command


class DeliveryError(Exception):
    """One try failed; the message says why (status, error, exit code)."""


Deliver = Callable[[Event], None]


def webhook(url: str) -> Deliver:
    """POST the event as JSON; any 2xx is delivered."""

    def deliver(event: Event) -> None:
        body = json.dumps(event.to_json()).encode()
        request = urllib.request.Request(
            url,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "User-Agent": f"launcher-watch/{__version__}",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=SEND_TIMEOUT) as answer:
                answer.read(65536)
        except urllib.error.HTTPError as exc:
            raise DeliveryError(f"HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise DeliveryError(str(getattr(exc, "reason", exc))) from None

    return deliver


def command(argv: Sequence[str]) -> Deliver:
    """Run argv (no shell) with the event in LAUNCHER_EVENT_* variables; exit 0 is delivered."""
    import os

    def deliver(event: Event) -> None:
        env = {**os.environ, **event.environment()}
        try:
            done = subprocess.run(
                list(argv),
                env=env,
                stdin=subprocess.DEVNULL,
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


def parse_webhook(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"--webhook {url!r}: not an http:// or https:// URL")
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


class Notifier:
    """Queues events for every destination and delivers them from a background thread."""

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
        self._jobs: list[_Job] = []
        self._seq = 0
        self._cond = threading.Condition()
        self._stopping = False
        self._busy = 0
        self._thread = threading.Thread(target=self._loop, name="watch-notify", daemon=True)
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
        self._thread.start()

    def send(self, event: Event) -> None:
        """Queue an event (already in the state's outbox) for every destination; never blocks
        on the network."""
        now = self.clock()
        for name in self.destinations:
            self._queue(event, name, 1, now)

    def _queue(self, event: Event, name: str, attempt: int, due: float) -> None:
        with self._cond:
            self._seq += 1
            heapq.heappush(self._jobs, _Job(due, self._seq, event, name, attempt))
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and (not self._jobs or self._jobs[0].due > self.clock()):
                    timeout = self._jobs[0].due - self.clock() if self._jobs else None
                    self._cond.wait(timeout)
                if self._stopping:
                    return
                job = heapq.heappop(self._jobs)
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
            if job.attempt >= MAX_ATTEMPTS:
                self.failed += 1
                self.log(
                    f"notify: {job.destination}: giving up on event {job.event.kind} "
                    f"after {job.attempt} tries: {error}"
                )
                self.state.delivered(job.event.id, job.destination)
                return
            delay = min(self.first_backoff * 2 ** (job.attempt - 1), MAX_BACKOFF)
            self.log(
                f"notify: {job.destination}: try {job.attempt} failed ({error}); "
                f"again in {delay:g} s"
            )
            self._queue(job.event, job.destination, job.attempt + 1, self.clock() + delay)
            return
        self.sent += 1
        self.state.delivered(job.event.id, job.destination)

    def drain(self, timeout: float) -> bool:
        """Wait up to `timeout` for every queued delivery (retries too); True when none is left."""
        end = self.clock() + timeout
        with self._cond:
            while self._busy or self._jobs:
                left = end - self.clock()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.1))
            return not self._jobs and not self._busy

    def stop(self, timeout: float = 5.0) -> None:
        """Deliver what is queued (within `timeout`), then stop; the rest stays in the outbox."""
        if self._thread.is_alive():
            self.drain(timeout)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=SEND_TIMEOUT + 1)
