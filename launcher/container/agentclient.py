"""The client of the in-container agent: one method per op, typed by `launcher.agent.protocol`.

Every call is one `pct exec VMID -- python3 -c BOOT`; BOOT runs a small loader that arrives on
stdin next to the request, so nothing is installed in the container and the command line stays
short. The agent itself (protocol.py and the modules of launcher/agent/, ~90 KB: "the bundle",
see launcher/agent/__init__.py) is cached in the container under /run/launcher by its sha256, so
a call normally sends only the loader (launcher/agent/boot.py, compressed), the hash and the
request (under 2 KB with the command line). Requests are built and answers read here and
nowhere else; agent error kinds become LauncherErrors (and so exit codes) here and nowhere else.

The cache, and why it is built this way:
- The loader reads <cache>/agent-<sha256>.bundle, hashes the bytes it read and runs those very
  bytes only when the hash matches: a tampered or truncated file is never executed.
- On a miss (no file, wrong hash, unreadable) it runs nothing, says so on stderr and exits
  MISS_EXIT; the client sends the call again with the bundle, which the agent runs and then
  caches (launcher/agent/cache.py). A miss costs one more round trip, once per container and
  launcher version (and after the container's /run is cleared), and never a failure: nothing ran.
- Trying the cache first even in a new process is what makes a one-call command (`status`)
  cheap; the per-process memory below only stops a container that cannot keep the cache
  (read-only or full /run) from costing two round trips on every call of a long command.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
import zlib
from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal, cast

from launcher import agent
from launcher.agent import boot
from launcher.agent import protocol as p
from launcher.agent.protocol import AGENT_ARGV
from launcher.container import ctstate
from launcher.container.answers import present_problem, problem
from launcher.container.pct import Container, HostShell, stamped_command
from launcher.core.errors import (
    CommandTimeout,
    ContainerError,
    LauncherError,
    PausedError,
    ProtocolError,
    RefusedError,
    RemoteError,
    TransferError,
    UnhealthyError,
    UnsafePathError,
    UsageError,
)
from launcher.transport.endpoint import CommandResult

if TYPE_CHECKING:
    from launcher.config.models import Target


# The loader's own constants: boot.py is the one place they are written.
CACHE_DIR = boot.CACHE_DIR
MISS_EXIT = boot.MISS_EXIT  # EX_TEMPFAIL: the loader found no valid cached bundle and ran nothing
MISS_MARKER = boot.MISS_MARKER


@cache
def boot_source() -> str:
    """launcher/agent/boot.py as it travels, on every call: without its comment lines and blank
    lines, indented by one space a level instead of four (it has no comment after code, no
    string spanning lines and no indent but by fours: a test checks that the code is the same)."""
    text = resources.files("launcher.agent").joinpath("boot.py").read_text(encoding="utf-8")
    kept = []
    for line in text.splitlines():
        code = line.lstrip(" ")
        if code and not code.startswith("#"):
            kept.append(" " * ((len(line) - len(code)) // 4) + code)
    return "\n".join(kept) + "\n"


@cache
def boot_wire() -> str:
    """The loader as the stdin line carries it: boot_source, zlib-compressed, in base64 (BOOT
    undoes both); about 1.4 KB."""
    return base64.b64encode(zlib.compress(boot_source().encode("utf-8"), 9)).decode("ascii")


# How a line carries the agent: "source" sends the bundle and caches nothing (tests that run
# BOOT by hand), "store" sends it and caches it, "cached" sends only its sha256.
Mode = Literal["source", "store", "cached"]

# How each agent error kind maps onto the one exit-code table (via the error classes).
ERROR_KINDS: dict[str, type[LauncherError]] = {
    "refused": RefusedError,
    "locked": RefusedError,
    "unsafe_path": UnsafePathError,
    "corrupt": TransferError,
    "compile": UsageError,
    "missing": ContainerError,
    "invalid": UsageError,
    "failed": RemoteError,
    "down": UnhealthyError,  # reached, acted on, and the run is not running: not "unreachable"
    "expired": CommandTimeout,  # reached after its client's deadline: nothing was changed
}
assert set(ERROR_KINDS) == set(p.ERROR_KINDS), "every agent error kind has an exit code"

# Each op's request and answer type: every answer is checked against its op's type before a
# workflow reads it (check_answer); tests/local/test_protocol_contract.py checks that the agent's
# handlers read only what the request types declare and that both maps cover every op.
REQUESTS: dict[str, type] = {
    "preflight": p.PreflightRequest,
    "apply": p.TransactionRequest,
    "rollback": p.TransactionRequest,
    "stop": p.StopRequest,
    "poll": p.PollRequest,
    "logs": p.LogsRequest,
    "follow": p.FollowRequest,
    "history": p.HistoryRequest,
    "releases": p.ReleasesRequest,
    "network": p.NetworkRequest,
}
ANSWERS: dict[str, type] = {
    "preflight": p.PreflightAnswer,
    "apply": p.TransactionAnswer,
    "rollback": p.TransactionAnswer,
    "stop": p.StopAnswer,
    "poll": p.PollAnswer,
    "logs": p.LogsAnswer,
    "follow": p.FollowAnswer,
    "history": p.HistoryAnswer,
    "releases": p.ReleasesAnswer,
    "network": p.NetworkAnswer,
}
assert set(REQUESTS) == set(ANSWERS) == set(p.OPS), "every op has a request and an answer type"

# Ops that change something: their requests carry a deadline (protocol.py, `deadline`), and a
# client that stops waiting for one says what may still happen.
CHANGING_OPS = {"apply": "the deploy", "rollback": "the rollback", "stop": "the stop"}
assert set(CHANGING_OPS) <= set(p.OPS)
# Of a call's time, the share kept back to ask the host why the container did not answer
# (launcher.container.ctstate), at most DIAGNOSIS_LIMIT s: a call and that question end within the
# caller's timeout.
DIAGNOSIS_SHARE = 0.2
DIAGNOSIS_LIMIT = 8.0
# The agent's deadline ends this long (at most a tenth of the wait) before the client stops
# waiting: the time between the client's start and the host's shell starting the command (a
# channel opened, a free SSH session waited for), which the host's clock does not see.
SEND_MARGIN = 2.0
# A read that has not answered after this many seconds is asked about on the host while it
# waits (a frozen CT answers nothing until the backup ends, which can take an hour).
EARLY_LOOK = 5.0


def split_timeout(timeout: float | None) -> tuple[float | None, float]:
    """(how long to wait for the agent, how long to ask the host why it did not answer)."""
    if timeout is None:
        return None, 0.0
    reserve = min(DIAGNOSIS_LIMIT, timeout * DIAGNOSIS_SHARE)
    if reserve < ctstate.MIN_SECONDS:
        return timeout, 0.0
    return timeout - reserve, reserve


def agent_deadline(wait: float) -> float:
    """The request's `deadline` for a client that waits `wait` seconds for the answer."""
    return max(0.0, wait - min(SEND_MARGIN, wait * 0.1))


def with_deadline(request: dict[str, Any], wait: float | None) -> dict[str, Any]:
    """`request` with its deadline when it changes something (a plan changes nothing)."""
    if wait is None or request.get("op") not in CHANGING_OPS or request.get("plan"):
        return request
    return {**request, "deadline": round(agent_deadline(wait), 3)}


ByteSink = Callable[[bytes], None]
EventSink = Callable[[dict[str, Any]], None]


class _EventLines:
    """Splits the agent's stderr into event lines (JSON, handed to `sink` at once) and the rest
    (kept in `other` for error messages and the cache-miss marker)."""

    def __init__(self, sink: EventSink) -> None:
        self.sink = sink
        self.pending = b""
        self.other = b""

    def feed(self, data: bytes) -> None:
        self.pending += data
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            self._line(line)

    def close(self) -> None:
        if self.pending:
            self._line(self.pending)
            self.pending = b""

    def _line(self, line: bytes) -> None:
        if line.startswith(b'{"event"'):
            try:
                event = json.loads(line)
            except ValueError:
                event = None
            if isinstance(event, dict):
                self.sink(event)
                return
        self.other += line + b"\n"


class AgentFailure(LauncherError):
    """Carries the agent's whole answer (e.g. the deploy steps done so far) with the error."""

    def __init__(self, error: LauncherError, response: dict[str, Any]) -> None:
        super().__init__(error.message, hint=error.hint)
        self.exit_code = error.exit_code
        self.response = response


@cache
def agent_sources() -> tuple[tuple[str, str], ...]:
    """(module name, source) of the protocol and the agent's modules, in the order they run."""
    names = ("launcher.agent.protocol", *(f"launcher.agent.{name}" for name in agent.MODULES))
    return tuple((name, _module_source(name)) for name in names)


def _module_source(name: str) -> str:
    *folders, leaf = name.split(".")
    where = resources.files(folders[0])
    for folder in folders[1:]:
        where = where.joinpath(folder)
    return where.joinpath(f"{leaf}.py").read_text(encoding="utf-8")


@cache
def bundle() -> tuple[str, str]:
    """(the bundle, its sha256): each module's name and source, all joined by NULs, which
    Python source never holds (launcher/agent/__init__.py). The hash is over its UTF-8 bytes,
    exactly what the agent caches and the loader reads."""
    text = "\0".join(part for pair in agent_sources() for part in pair)
    return text, hashlib.sha256(text.encode("utf-8")).hexdigest()


def payload(request: object, *, mode: Mode = "source", cache_dir: str | None = None) -> bytes:
    """The one stdin line BOOT reads: the loader, the request and the agent (see Mode).
    `cache_dir` replaces /run/launcher, for tests that run BOOT on this machine."""
    text, digest = bundle()
    line: dict[str, Any] = {"boot": boot_wire(), "request": request}
    if mode != "cached":
        line["bundle"] = text
    if mode != "source":
        line["sha256"] = digest
    if cache_dir is not None:
        line["cache_dir"] = cache_dir
    return (json.dumps(line) + "\n").encode()


def is_miss(exit_code: int, stderr: str) -> bool:
    """The loader found no valid cached bundle (and so ran nothing)."""
    return exit_code == MISS_EXIT and MISS_MARKER in stderr


class _Known:
    """Per process: containers that missed the cache after this process sent them the bundle
    (their /run cannot keep it), which then get the bundle with every call. Keyed by the host
    object's identity (fakes are not hashable), which is kept alive so the id stays its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: dict[tuple[int, int], tuple[object, str]] = {}

    def get(self, container: Container) -> str:
        entry = self._state.get((id(container.host), container.vmid))
        return entry[1] if entry is not None and entry[0] is container.host else "unknown"

    def set(self, container: Container, state: str) -> None:
        with self._lock:
            self._state[(id(container.host), container.vmid)] = (container.host, state)


_known = _Known()


class _Waiting:
    """Per process: the read left waiting in each container (a frozen CT's), until it ends.
    Keyed as _Known."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: dict[tuple[int, int], tuple[object, threading.Event]] = {}

    def busy(self, container: Container) -> bool:
        entry = self._state.get((id(container.host), container.vmid))
        return entry is not None and entry[0] is container.host and not entry[1].is_set()

    def left(self, container: Container, done: threading.Event) -> None:
        with self._lock:
            self._state[(id(container.host), container.vmid)] = (container.host, done)


_waiting = _Waiting()


def check_answer(label: str, op: object, answer: object) -> dict[str, Any]:
    """`answer` as the protocol says `op`'s answer is, or ProtocolError; an answer that carries
    an error becomes that error (AgentFailure). The envelope is checked first, so an error is
    read from a well-formed one; a failed op's answer has the part of its data it carries
    checked (the deploy steps done so far)."""
    found = problem(answer, p.Envelope)
    if found is None:
        envelope = cast(dict[str, Any], answer)
        if envelope["op"] != op:
            found = f"answer['op'] is {envelope['op']!r}, not {op!r}"
        elif envelope["ok"] is not (envelope["error"] is None):
            found = "answer['ok'] disagrees with answer['error']"
        else:
            kind = ANSWERS.get(str(op))
            if kind is not None:
                ok = envelope["ok"]
                found = problem(answer, kind) if ok else present_problem(envelope, kind)
            failure = None if found else error_for(label, envelope)
            if failure is not None:
                raise failure
    if found is not None:
        raise ProtocolError(
            f"{label}: the agent's answer to {op!r} does not match this launcher's protocol: "
            f"{found}",
            hint="the container ran something other than the agent launcher sent: check what "
            "`python3` is inside the container",
        )
    return cast(dict[str, Any], answer)


def error_for(label: str, envelope: dict[str, Any]) -> LauncherError | None:
    """The LauncherError an answer's error stands for, or None when it succeeded."""
    error = envelope.get("error")
    if envelope.get("ok") or not error:
        return None
    kind = ERROR_KINDS.get(str(error.get("kind")), RemoteError)
    return AgentFailure(kind(f"{label}: {error.get('message')}"), envelope)


class AgentClient:
    """The agent in one container; each method is one round trip (two on a cache miss)."""

    def __init__(self, container: Container) -> None:
        self.container = container
        self.label = container.label

    # -- transport ------------------------------------------------------------------------
    def _with_agent(self, attempt: Callable[[Mode], tuple[int, str]]) -> None:
        """Run `attempt(mode)` with the cached agent, and once more with the bundle when the
        container missed; `attempt` returns (exit code, stderr) and keeps its own results."""
        known = _known.get(self.container)
        if known != "uncached":
            code, err = attempt("cached")
            if not is_miss(code, err):
                return
            # A miss after this process sent the bundle: this container cannot keep it.
            _known.set(self.container, "uncached" if known == "sent" else "sent")
        attempt("store")

    def call(self, request: object, *, timeout: float | None = None) -> dict[str, Any]:
        """Run one op and return its answer; failures become errors (AgentFailure carries the
        answer, e.g. the deploy steps done so far)."""
        op = cast(dict[str, Any], request).get("op")
        wait, reserve = split_timeout(timeout)
        sent = with_deadline(cast(dict[str, Any], request), wait)
        results: list[CommandResult] = []

        def attempt(mode: Mode) -> tuple[int, str]:
            result = self.container.exec(
                list(AGENT_ARGV), stdin=payload(sent, mode=mode), timeout=wait, stamped=True
            )
            results.append(result)
            return result.exit_code, result.err

        self._answering(op, timeout, reserve, lambda: self._with_agent(attempt))
        return self._answer(op, results[-1])

    def _answering(
        self, op: object, timeout: float | None, reserve: float, send: Callable[[], None]
    ) -> None:
        """Run `send`; a call that does not answer in time becomes an error saying why, as far
        as the host can tell in `reserve` seconds (a CT frozen or locked by a backup: paused),
        and, for a request that changes something, what may still happen."""
        early = timeout is not None and timeout > EARLY_LOOK + 2 * reserve and reserve > 0
        if op in CHANGING_OPS or not early:
            try:
                send()
            except CommandTimeout:
                raise self._no_answer(str(op), timeout, reserve) from None
            return
        self._answering_or_paused(str(op), timeout, reserve, send)

    def _answering_or_paused(
        self, op: str, timeout: float | None, reserve: float, send: Callable[[], None]
    ) -> None:
        """A read (it changes nothing, so it may be left behind) that has not answered after
        EARLY_LOOK s: the host is asked while it waits, and a CT frozen or locked by a backup
        is said at once instead of after the whole timeout. One read left waiting per
        container at most: while it waits, the next read asks the host first (a watcher's
        polls of a frozen CT must not pile up on the host's SSH sessions)."""
        if _waiting.busy(self.container):
            state = ctstate.ct_state(self.container.host, self.container.vmid, reserve)
            if state.paused:
                raise self._paused(op, state)
        outcome: list[BaseException | None] = []
        done = threading.Event()

        def work() -> None:
            try:
                send()
                outcome.append(None)
            except BaseException as exc:  # handed over to the caller's thread
                outcome.append(exc)
            finally:
                done.set()

        threading.Thread(target=work, name=f"agent-{op}", daemon=True).start()
        if not done.wait(EARLY_LOOK):
            state = ctstate.ct_state(self.container.host, self.container.vmid, reserve)
            if not done.is_set() and state.paused:
                _waiting.left(self.container, done)
                raise self._paused(op, state)
            done.wait()
        error = outcome[0]
        if isinstance(error, CommandTimeout):
            raise self._no_answer(op, timeout, reserve) from None
        if error is not None:
            raise error

    def _paused(self, op: str, state: ctstate.CtState) -> PausedError:
        return PausedError(
            f"{self.label}: agent op {op!r} does not answer; {state.sentence()}",
            hint=f"try again once the backup is over (`pct config {self.container.vmid}` "
            "shows its lock)",
        )

    def _no_answer(self, op: str, timeout: float | None, reserve: float) -> LauncherError:
        vmid = self.container.vmid
        state = ctstate.ct_state(self.container.host, vmid, reserve) if reserve else None
        found = state.sentence() if state else None
        paused = state is not None and state.paused
        what = CHANGING_OPS.get(op)
        within = f" within {timeout:g} s" if timeout is not None else ""
        head = f"{self.label}: {what or f'agent op {op!r}'} did not finish{within}"
        parts = [head] + ([found] if found else [])
        hint = None
        if what is not None:
            parts.append(
                f"{what} may still complete in the container (once begun it runs to its end; "
                "it never begins after its deadline, which has passed)"
            )
            hint = "run `launcher status` to see what runs now"
        elif paused:
            hint = f"try again once the backup is over (`pct config {vmid}` shows its lock)"
        kind = PausedError if paused else CommandTimeout
        return kind("; ".join(parts), hint=hint)

    def _answer(self, op: object, result: CommandResult) -> dict[str, Any]:
        """The answer in `result` (the last line on stdout); failures become errors."""
        text = result.out.strip()
        if result.exit_code != 0 or not text:
            if result.exit_code in (126, 127) or (
                "python3" in result.err and "not found" in result.err
            ):
                raise ContainerError(
                    f"{self.label}: python3 is not available inside the container",
                    hint="install python3 in the container (apt-get install python3)",
                )
            raise RemoteError(
                f"{self.label}: agent op {op!r} failed (exit {result.exit_code}): {result.tail(5)}"
            )
        try:
            answer: object = json.loads(text.splitlines()[-1])
        except json.JSONDecodeError:
            raise RemoteError(f"{self.label}: unreadable agent answer: {result.tail(3)}") from None
        return check_answer(self.label, op, answer)

    # -- ops ------------------------------------------------------------------------------
    def preflight(
        self, request: p.PreflightRequest, *, timeout: float | None = None
    ) -> p.PreflightAnswer:
        return cast(p.PreflightAnswer, self.call({**request, "op": "preflight"}, timeout=timeout))

    def transaction(
        self,
        request: p.TransactionRequest,
        *,
        timeout: float | None = None,
        on_event: EventSink | None = None,
    ) -> p.TransactionAnswer:
        """apply or rollback (request["op"]); AgentFailure.response is a TransactionAnswer.

        With `on_event`, the agent reports each step (and the stop's countdown) as it happens,
        as JSON lines on stderr, and they are handed over as they arrive."""
        if on_event is None or not hasattr(self.container.host, "stream"):
            return cast(p.TransactionAnswer, self.call(request, timeout=timeout))
        wait, reserve = split_timeout(timeout)
        streamed = with_deadline({**request, "events": True}, wait)
        results: list[CommandResult] = []

        def attempt(mode: Mode) -> tuple[int, str]:
            stdout = bytearray()
            events = _EventLines(on_event)
            started = time.monotonic()
            code = self.container.stream(
                list(AGENT_ARGV),
                stdout.extend,
                on_stderr=events.feed,
                stdin=payload(streamed, mode=mode),
                timeout=wait,
                stamped=True,
            )
            events.close()
            results.append(
                CommandResult(
                    "agent", code, bytes(stdout), events.other, time.monotonic() - started
                )
            )
            return code, results[-1].err

        op = request.get("op")
        self._answering(op, timeout, reserve, lambda: self._with_agent(attempt))
        return cast(p.TransactionAnswer, self._answer(op, results[-1]))

    def releases(
        self, request: p.ReleasesRequest, *, timeout: float | None = None
    ) -> p.ReleasesAnswer:
        return cast(p.ReleasesAnswer, self.call({**request, "op": "releases"}, timeout=timeout))

    def network(
        self, request: p.NetworkRequest, *, timeout: float | None = None
    ) -> p.NetworkAnswer:
        return cast(p.NetworkAnswer, self.call(request, timeout=timeout))

    def stop(self, request: p.StopRequest, *, timeout: float | None = None) -> p.StopAnswer:
        return cast(p.StopAnswer, self.call(request, timeout=timeout))

    def poll(self, request: p.PollRequest, *, timeout: float | None = None) -> p.PollAnswer:
        return cast(p.PollAnswer, self.call(request, timeout=timeout))

    def logs(self, request: p.LogsRequest, *, timeout: float | None = None) -> p.LogsAnswer:
        return cast(p.LogsAnswer, self.call(request, timeout=timeout))

    def history(
        self, request: p.HistoryRequest, *, timeout: float | None = None
    ) -> p.HistoryAnswer:
        return cast(p.HistoryAnswer, self.call(request, timeout=timeout))

    def follow(
        self,
        request: p.FollowRequest,
        on_data: ByteSink,
        *,
        idle_timeout: float,
    ) -> p.FollowAnswer:
        """Stream the log over one `pct exec` (stdout carries the bytes, the envelope is the
        last line on stderr); an exception from `on_data` ends the stream and propagates.
        A cache miss sends nothing to `on_data`: the loader ran nothing."""
        host = self.container.host
        stream = getattr(host, "stream", None)
        if stream is None:
            raise RemoteError(f"{self.label}: this connection cannot stream")
        outcome: list[tuple[int, str]] = []

        def attempt(mode: Mode) -> tuple[int, str]:
            stderr = bytearray()
            code: int = stream(
                stamped_command(self.container.vmid, list(AGENT_ARGV)),
                on_data,
                on_stderr=stderr.extend,
                stdin=payload(request, mode=mode),
                close_stdin=False,  # the agent sees EOF on stdin when we go away
                idle_timeout=idle_timeout,
            )
            outcome.append((code, stderr.decode("utf-8", "replace").strip()))
            return outcome[-1]

        self._with_agent(attempt)
        code, text = outcome[-1]
        last = text.splitlines()[-1] if text else ""
        try:
            answer: object = json.loads(last) if last.startswith("{") else {}
        except json.JSONDecodeError:
            answer = {}
        if code != 0 or not answer:
            detail = "\n".join(text.splitlines()[-5:]) or "no answer"
            raise RemoteError(f"{self.label}: following the log failed (exit {code}): {detail}")
        return cast(p.FollowAnswer, check_answer(self.label, "follow", answer))


def container_for(target: Target, conn: HostShell) -> Container:
    """The target's container on `conn` (its host), labelled for messages."""
    return Container(conn, target.vmid, label=target.label)
