"""The agent bundle cache in a real container: written by the first call, used by the next ones
(which send under 3 KB), and a corrupted cache file is not run but repaired."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from launcher.agent.protocol import FollowRequest
from launcher.config.models import HostSpec
from launcher.container.agentclient import AgentClient, bundle
from launcher.container.pct import Container
from launcher.sandbox import Sandbox, SandboxInfo
from launcher.transport.connection import Connection
from launcher.transport.endpoint import CommandResult, Endpoint
from launcher.transport.resolve import resolve_endpoint
from tests.e2e.project import Project

pytestmark = pytest.mark.e2e

VMID = 202
TEXT, DIGEST = bundle()
CACHE = Path("run/launcher")  # under the container's rootfs
NAME = f"agent-{DIGEST}.bundle"
# A cached call: the loader (~2.3 KB as sent), the sha256 and the request.
CACHED_LINE = 3072


class Recording:
    """The real SSH connection, keeping what each command sent: (command bytes, stdin bytes)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.sent: list[tuple[int, int]] = []

    @property
    def endpoint(self) -> Endpoint:
        return self.conn.endpoint

    def run(
        self, command: str, *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        self.sent.append((len(command.encode()), len(stdin or b"")))
        return self.conn.run(command, stdin=stdin, timeout=timeout)

    def stream(self, command: str, on_stdout: Callable[[bytes], None], **kwargs: Any) -> int:
        self.sent.append((len(command.encode()), len(kwargs.get("stdin") or b"")))
        return self.conn.stream(command, on_stdout, **kwargs)


@pytest.fixture(scope="module")
def conn(sandbox: tuple[Sandbox, SandboxInfo]) -> Iterator[Connection]:
    info = sandbox[1]
    spec = HostSpec.model_validate(
        {
            "address": info.address,
            "port": info.port,
            "identity_file": str(info.identity_file),
            "known_hosts": str(info.known_hosts),
            "connect_timeout": 5,
        }
    )
    connection = Connection(resolve_endpoint("sandbox", spec))
    yield connection
    connection.close()


@pytest.fixture
def cache(sandbox: tuple[Sandbox, SandboxInfo]) -> Iterator[Path]:
    """The container's /run/launcher, seen from the host, with no cached bundle in it."""
    path = sandbox[0].container_root(VMID) / CACHE
    for old in [*path.glob("agent-*.bundle"), *path.glob("agent-*.code")]:
        old.unlink()
    yield path
    if path.is_dir():
        os.chown(path, 0, 0)


def client(recording: Recording) -> AgentClient:
    return AgentClient(Container(recording, VMID, label="sandbox/cache"))


def history(workdir: str = "/root/cachetest") -> dict[str, Any]:
    return {"op": "history", "workdir": workdir}


def test_first_call_caches_the_agent_and_the_next_sends_under_2kb(
    conn: Connection, cache: Path, sandbox: tuple[Sandbox, SandboxInfo]
) -> None:
    sb = sandbox[0]
    first = Recording(conn)
    assert client(first).call(history())["ok"]
    # The cache was tried (a miss), then the bundle sent: two round trips, once.
    assert len(first.sent) == 2 and first.sent[1][1] > len(TEXT)
    stored = cache / NAME
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == DIGEST
    assert stored.stat().st_mode & 0o777 == 0o600 and stored.stat().st_uid == 0
    assert cache.stat().st_mode & 0o777 == 0o700 and cache.stat().st_uid == 0
    # ...and compiled, for the container's python3, next to it.
    [code] = cache.glob(f"agent-{DIGEST}.*.code")
    assert code.stat().st_mode & 0o777 == 0o600 and code.stat().st_uid == 0

    later = Recording(conn)  # a new process would know nothing either: it reads the cache
    pct0 = sb.pct_calls()
    poll = {"op": "poll", "workdir": "/root/cachetest", "session": "cachetest", "lines": 500}
    assert client(later).call(poll)["ok"]
    assert sb.pct_calls() - pct0 == 1
    [(command, stdin)] = later.sent
    assert stdin < CACHED_LINE and command + stdin < CACHED_LINE, later.sent


def test_corrupted_cache_file_is_not_run_and_is_repaired(
    project: Project, cache: Path, sandbox: tuple[Sandbox, SandboxInfo]
) -> None:
    root = sandbox[0].container_root(VMID)
    marker = root / "root" / "tampered-bundle-ran"
    marker.unlink(missing_ok=True)
    cache.mkdir(mode=0o700, exist_ok=True)
    code = "open('/root/tampered-bundle-ran', 'w').write('ran')\ndef main(request):\n    return 0\n"
    (cache / NAME).write_bytes(f"launcher.agent.main\0{code}".encode())

    project.write({"cachetest": (VMID, project.playbook("cachetest"))})
    result = project.launcher("history")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no deploys recorded" in result.stdout
    assert not marker.exists()
    assert hashlib.sha256((cache / NAME).read_bytes()).hexdigest() == DIGEST

    truncated = (cache / NAME).read_bytes()[:1000]
    (cache / NAME).write_bytes(truncated)
    again = project.launcher("history")
    assert again.returncode == 0, again.stdout + again.stderr
    assert hashlib.sha256((cache / NAME).read_bytes()).hexdigest() == DIGEST


def test_follow_uses_the_cache(conn: Connection, cache: Path, sandbox: tuple[Sandbox, Any]) -> None:
    state = sandbox[0].container_root(VMID) / "root" / "cachefollow" / ".launcher"
    state.mkdir(parents=True, exist_ok=True)
    (state / "cachefollow.log").write_bytes(b"step 1\nstep 2\n")
    (state / "cachefollow.exit").write_text("0\n")
    request: FollowRequest = {
        "op": "follow",
        "workdir": "/root/cachefollow",
        "session": "cachefollow",
        "offset": 0,
        "heartbeat": 5.0,
        "interval": 0.1,
    }
    recording = Recording(conn)
    for _ in range(2):
        received = bytearray()
        answer = client(recording).follow(request, received.extend, idle_timeout=30)
        assert answer["ended"] == {"reason": "exited", "exit_code": 0}
        assert bytes(received) == b"step 1\nstep 2\n"  # the miss put nothing in the stream
    assert [stdin < CACHED_LINE for _, stdin in recording.sent] == [True, False, True]


def test_container_that_cannot_keep_the_cache_still_works(conn: Connection, cache: Path) -> None:
    """/run/launcher not ours (as good as read-only for the cache): every call still answers,
    and after one more miss the bundle is sent directly."""
    cache.mkdir(mode=0o700, exist_ok=True)
    os.chown(cache, 65534, 65534)
    recording = Recording(conn)
    for _ in range(3):
        assert client(recording).call(history())["ok"]
    assert not (cache / NAME).exists()
    bundles = [stdin > len(TEXT) for _, stdin in recording.sent]
    assert bundles == [False, True, False, True, True]
