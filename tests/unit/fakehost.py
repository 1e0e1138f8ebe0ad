"""A strict fake host connection: every call must be expected, in order, or the test fails."""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from launcher.agent.protocol import AGENT_ARGV
from launcher.container.pct import VERIFY_SCRIPT as VERIFY
from launcher.container.pct import split_stamped
from launcher.transport.endpoint import CommandResult


def is_agent_call(command: str) -> bool:
    """The agent run in a container, with the host's clock as its last argument."""
    stamped = split_stamped(command)
    return stamped is not None and stamped[1] == AGENT_ARGV


@dataclass
class FakeEndpoint:
    name: str = "fake"
    command_timeout: float = 30.0
    connect_timeout: float = 10.0
    hostname: str = "10.1.2.6"
    port: int = 22
    user: str = "root"
    known_hosts: str = "/home/ann/.ssh/known_hosts"


Handler = Callable[[list[str], dict[str, Any] | None], CommandResult]
StreamHandler = Callable[[dict[str, Any], Callable[[bytes], None], Callable[[bytes], None]], int]


@dataclass
class Expectation:
    kind: str  # "agent:<op>", "stream:<op>", "push", "verify", "put", "remove", "exec", "host"
    respond: Callable[..., Any]


@dataclass
class StrictFakeHost:
    """Answers only what the test scripted; anything else raises AssertionError at once."""

    expected: list[Expectation] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    endpoint: FakeEndpoint = field(default_factory=FakeEndpoint)
    pushed: dict[str, bytes] = field(default_factory=dict)

    def expect_agent(
        self, op: str, answer: dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]
    ) -> None:
        def respond(request: dict[str, Any]) -> dict[str, Any]:
            return answer(request) if callable(answer) else answer

        self.expected.append(Expectation(f"agent:{op}", respond))

    def expect(self, kind: str, respond: Callable[..., Any] = lambda *a: None) -> None:
        self.expected.append(Expectation(kind, respond))

    def _next(self, kind: str) -> Expectation:
        self.calls.append(kind)
        if not self.expected:
            raise AssertionError(f"unexpected call {kind!r}: nothing more was expected")
        head = self.expected.pop(0)
        if head.kind != kind:
            raise AssertionError(f"unexpected call {kind!r}: expected {head.kind!r}")
        return head

    def run(
        self, command: str, *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        argv = shlex.split(command)
        if is_agent_call(command):
            assert stdin is not None, "agent call without stdin"
            request = json.loads(stdin.decode().splitlines()[0])["request"]
            answer = self._next(f"agent:{request['op']}").respond(request)
            body = {"ok": True, "op": request["op"], "error": None, "warnings": [], **answer}
            return CommandResult(command, 0, (json.dumps(body) + "\n").encode(), b"", 0.0)
        if argv[:2] == ["sh", "-c"] and argv[3:4] == ["launcher-push"]:
            # respond(argv) -> exit code, or (exit code, stderr): a real pct push exits 0 and
            # prints its task's error on stderr; an exit code and no stderr wrote the file.
            answer = self._next("push").respond(argv[4:])
            code, err = answer if isinstance(answer, tuple) else (answer, "")
            if not err:
                self.pushed[argv[5]] = stdin or b""
            return CommandResult(command, code or 0, b"", str(err).encode(), 0.0)
        if argv[:2] == ["pct", "exec"] and argv[4:9] == ["python3", "-I", "-S", "-c", VERIFY]:
            self._next("verify").respond(argv[9:])
            return CommandResult(command, 0, self._verified(argv[9::3]).encode(), b"", 0.0)
        if argv[:2] == ["pct", "exec"]:
            code = self._next("exec").respond(argv[4:])
            return CommandResult(command, code or 0, b"", b"", 0.0)
        # Any other host command: respond(argv) -> exit code, or (exit code, stdout[, stderr]).
        answer = self._next("host").respond(argv)
        code, out, err = (*answer, "", "")[:3] if isinstance(answer, tuple) else (answer, "", "")
        return CommandResult(command, code or 0, str(out).encode(), str(err).encode(), 0.0)

    def _verified(self, paths: list[str]) -> str:
        """What the container's check of pushed files prints: what each path holds now."""
        rows = [
            [path, len(self.pushed[path]), hashlib.sha256(self.pushed[path]).hexdigest()]
            if path in self.pushed
            else [path, None, "No such file or directory"]
            for path in paths
        ]
        return "".join(json.dumps(row) + "\n" for row in rows)

    def expect_stream(self, op: str, respond: StreamHandler) -> None:
        """A streamed agent op: respond(request, on_stdout, on_stderr) -> exit code."""
        self.expected.append(Expectation(f"stream:{op}", respond))

    def stream(
        self,
        command: str,
        on_stdout: Callable[[bytes], None],
        *,
        on_stderr: Callable[[bytes], None] | None = None,
        stdin: bytes | None = None,
        close_stdin: bool = True,
        timeout: float | None = None,
        idle_timeout: float | None = None,
    ) -> int:
        if not is_agent_call(command) or stdin is None:
            raise AssertionError(f"unexpected streamed command {command!r}")
        request = json.loads(stdin.decode().splitlines()[0])["request"]
        if self.expected and self.expected[0].kind == f"agent:{request['op']}":
            # A transaction streamed for its live steps: answered like the plain agent call.
            answer = self._next(f"agent:{request['op']}").respond(request)
            body = {"ok": True, "op": request["op"], "error": None, "warnings": [], **answer}
            on_stdout((json.dumps(body) + "\n").encode())
            return 0
        code: int = self._next(f"stream:{request['op']}").respond(
            request, on_stdout, on_stderr or (lambda data: None)
        )
        return code

    def assert_done(self) -> None:
        assert not self.expected, f"expected calls never made: {[e.kind for e in self.expected]}"
