# mypy: allow-untyped-calls
"""The agent bundle cache: BOOT and its loader run with this host's python3 against a temp cache
directory, as they run inside a container (and AgentClient through a host that runs the
container's command here)."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import resource
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from launcher.agent import cache as agent_cache
from launcher.agent.protocol import AGENT_ARGV, BOOT, FollowRequest
from launcher.container.agentclient import (
    MISS_EXIT,
    MISS_MARKER,
    AgentClient,
    Mode,
    agent_sources,
    boot_source,
    bundle,
    payload,
)
from launcher.container.pct import Container, split_stamped
from launcher.transport.endpoint import CommandResult

PYTHON = shutil.which("python3") or "python3"
# A cached call's stdin line: the loader (~1.4 KB as sent, compressed), the sha256 and the request.
CACHED_LINE = 2048
LOADER_FILE = Path(__file__).resolve().parents[2] / "launcher" / "agent" / "boot.py"
TEXT, DIGEST = bundle()
NAME = f"agent-{DIGEST}.bundle"
# The interpreter the loader runs under, which keys the compiled copy of the bundle.
TAG, VERSION = subprocess.run(
    [PYTHON, "-c", "import sys; print(sys.implementation.cache_tag); print(sys.version, end='')"],
    capture_output=True,
    text=True,
    check=True,
).stdout.split("\n", 1)
CODE = f"agent-{DIGEST}.{TAG}.code"


def history(workdir: Path) -> dict[str, Any]:
    return {"op": "history", "workdir": str(workdir)}


def boot(
    request: dict[str, Any],
    mode: Mode,
    cache_dir: Path,
    preexec: Callable[[], None] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """One container call, run here: python3 -c BOOT with the line on stdin."""
    line = payload(request, mode=mode, cache_dir=str(cache_dir))
    return subprocess.run(
        [PYTHON, *AGENT_ARGV[1:]],
        input=line,
        capture_output=True,
        timeout=30,
        check=False,
        preexec_fn=preexec,
    )


def answer(result: subprocess.CompletedProcess[bytes]) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr.decode()
    doc: dict[str, Any] = json.loads(result.stdout.decode().splitlines()[-1])
    return doc


def assert_miss(result: subprocess.CompletedProcess[bytes]) -> None:
    assert result.returncode == MISS_EXIT
    assert result.stdout == b""  # no answer: the loader ran no op
    assert f"{MISS_MARKER} {DIGEST}" in result.stderr.decode()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    """Where the tests keep the cache: like /run/launcher, its parent exists and it does not."""
    (tmp_path / "run").mkdir()
    return tmp_path / "run" / "launcher"


# --------------------------------------------------------------------------- lines and syntax


def test_boot_and_loader_run_on_python38() -> None:
    ast.parse(BOOT, feature_version=(3, 8))
    ast.parse(boot_source(), feature_version=(3, 8))
    # One line in `ps`; short beside the ~1.9 KB a cached call sends in all.
    assert "\n" not in BOOT and len(BOOT) < 240


def module_imports(path: Path) -> set[str]:
    """The modules a file imports at its top level (not under `if TYPE_CHECKING:`)."""
    return module_imports_of(path.read_text())


def module_imports_of(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_boot_preloads_exactly_the_standard_modules_the_agent_imports() -> None:
    """BOOT imports them before it waits for its request (they load while it is on its way);
    a module the agent stops importing, or starts to, changes the list."""
    wanted = module_imports(LOADER_FILE)
    for _, source in agent_sources():
        wanted |= module_imports_of(source)
    wanted -= {"__future__", "launcher"}
    preloaded = set(BOOT.split(";")[0].removeprefix("import ").split(","))
    assert preloaded == wanted | {"json", "sys", "zlib"}  # zlib: BOOT's own, for the loader


def test_cached_line_is_small_and_carries_no_source(tmp_path: Path) -> None:
    request = {"op": "poll", "workdir": "/root/demo", "session": "demo", "lines": 500}
    cached = json.loads(payload(request, mode="cached"))
    stored = json.loads(payload(request, mode="store"))
    source = json.loads(payload(request))
    assert len(payload(request, mode="cached")) < CACHED_LINE
    assert "bundle" not in cached and cached["sha256"] == DIGEST and "cache_dir" not in cached
    assert stored["bundle"] == TEXT and stored["sha256"] == DIGEST
    assert source["bundle"] == TEXT and "sha256" not in source  # runs, caches nothing
    assert hashlib.sha256(TEXT.encode()).hexdigest() == DIGEST


# --------------------------------------------------------------------------- hit, miss, repair


def test_miss_runs_nothing_then_store_then_hit(tmp_path: Path, cache: Path) -> None:
    request = {
        "op": "preflight",
        "workdir": str(tmp_path / "wd"),
        "session": "demo",
        "dest": "train.py",
        "create_workdir": True,
    }
    assert_miss(boot(request, "cached", cache))
    assert not cache.exists() and not (tmp_path / "wd").exists()

    first = answer(boot(history(tmp_path), "store", cache))
    assert first["ok"] and first["op"] == "history"
    assert sorted(p.name for p in cache.iterdir()) == sorted([NAME, CODE])
    assert cache.stat().st_mode & 0o777 == 0o700
    assert (cache / NAME).stat().st_mode & 0o777 == 0o600
    assert (cache / CODE).stat().st_mode & 0o777 == 0o600
    assert sha256(cache / NAME) == DIGEST

    again = answer(boot(history(tmp_path), "cached", cache))
    assert again == first
    assert answer(boot(request, "cached", cache))["workdir"]["created"]  # now it runs


def test_source_mode_writes_no_cache(tmp_path: Path, cache: Path) -> None:
    assert answer(boot(history(tmp_path), "source", cache))["ok"]
    assert not cache.exists()


def evil_bundle(marker: Path) -> bytes:
    """A bundle that would leave `marker` behind if it were ever run."""
    code = f"open({str(marker)!r}, 'w').write('ran')\ndef main(request):\n    return 0\n"
    return f"launcher.agent.main\0{code}".encode()


def test_tampered_cache_file_is_never_run_and_is_rewritten(tmp_path: Path, cache: Path) -> None:
    cache.mkdir(parents=True, mode=0o700)
    marker = tmp_path / "tampered-bundle-ran"
    (cache / NAME).write_bytes(evil_bundle(marker))

    assert_miss(boot(history(tmp_path), "cached", cache))
    assert not marker.exists()
    # A compiled copy does not make a bad bundle good: the bundle's hash is checked first.
    write_code(cache / CODE, DIGEST, evil_code(marker))
    assert_miss(boot(history(tmp_path), "cached", cache))
    assert not marker.exists()

    assert answer(boot(history(tmp_path), "store", cache))["ok"]  # the client's resend
    assert sha256(cache / NAME) == DIGEST
    assert answer(boot(history(tmp_path), "cached", cache))["ok"]
    assert not marker.exists()


# --------------------------------------------------------------------------- the compiled copy


def evil_code(marker: Path) -> bytes:
    """The marshalled (name, code) pairs of a bundle that leaves `marker` behind."""
    source = f"open({str(marker)!r}, 'w').write('ran')\ndef main(request):\n    return 0\n"
    script = (
        "import marshal, sys; sys.stdout.buffer.write(marshal.dumps(("
        f"('launcher.agent.main', compile({source!r}, 'a', 'exec')),)))"
    )
    return subprocess.run([PYTHON, "-c", script], capture_output=True, check=True).stdout


def write_code(path: Path, digest: str, payload: bytes, version: str = VERSION) -> None:
    """A compiled copy keyed as the loader checks it (agent_cache.code_key, for `version`)."""
    key = hashlib.sha256(f"{digest} {version}\0".encode() + payload).digest()
    path.write_bytes(key + payload)
    path.chmod(0o600)


def keyed(data: bytes) -> bool:
    return hashlib.sha256(f"{DIGEST} {VERSION}\0".encode() + data[32:]).digest() == data[:32]


@pytest.fixture
def stored(tmp_path: Path, cache: Path) -> Path:
    """A cache after one store: the bundle and its compiled copy."""
    assert answer(boot(history(tmp_path), "store", cache))["ok"]
    assert (cache / CODE).is_file()
    return cache


def test_compiled_copy_is_what_runs(tmp_path: Path, stored: Path) -> None:
    """The loader runs the compiled copy when it is keyed right: shown by a copy of a different
    program (key computed as the loader does, here in the test), which then runs."""
    marker = tmp_path / "compiled-copy-ran"
    write_code(stored / CODE, DIGEST, evil_code(marker))
    assert keyed((stored / CODE).read_bytes())  # the test's key is the agent's
    boot(history(tmp_path), "cached", stored)
    assert marker.exists()


@pytest.mark.parametrize(
    "spoil",
    [
        "corrupt",  # a byte flipped in the code
        "other-version",  # keyed for another interpreter
        "other-bundle",  # an older launcher's copy renamed to this bundle's name
        "file-writable",  # group-writable: someone else could have written it
        "dir-writable",
    ],
)
def test_spoiled_compiled_copy_is_never_run_and_is_rewritten(
    tmp_path: Path, stored: Path, spoil: str
) -> None:
    marker = tmp_path / "spoiled-copy-ran"
    payload = evil_code(marker)
    if spoil == "corrupt":
        write_code(stored / CODE, DIGEST, payload)
        data = bytearray((stored / CODE).read_bytes())
        data[-5] ^= 0xFF
        (stored / CODE).write_bytes(bytes(data))
    elif spoil == "other-version":
        write_code(stored / CODE, DIGEST, payload, version="3.99.0 (main) [other]")
    elif spoil == "other-bundle":
        write_code(stored / CODE, "e" * 64, payload)
    else:
        write_code(stored / CODE, DIGEST, payload)
        (stored if spoil == "dir-writable" else stored / CODE).chmod(
            0o770 if spoil == "dir-writable" else 0o620
        )
    result = answer(boot(history(tmp_path), "cached", stored))
    assert result["ok"] and result["op"] == "history"  # the real agent ran, compiled afresh
    assert not marker.exists()
    if spoil != "dir-writable":  # a directory that is not private is not written into
        data = (stored / CODE).read_bytes()
        assert payload not in data and keyed(data)  # rewritten from the real bundle
        assert (stored / CODE).stat().st_mode & 0o777 == 0o600
        marker.unlink(missing_ok=True)
        boot(history(tmp_path), "cached", stored)  # the rewritten copy is the real agent
        assert not marker.exists()


def test_store_code_reports_the_path_it_wrote(tmp_path: Path) -> None:
    path = agent_cache.store_code(str(tmp_path / "c"), TEXT, (("m", compile("", "p", "exec")),) * 2)
    assert path is not None and path.endswith(".code")
    assert agent_cache.store_code(str(tmp_path / "missing" / "c"), TEXT, ()) is None


def test_truncated_cache_file_is_a_miss(tmp_path: Path, cache: Path) -> None:
    answer(boot(history(tmp_path), "store", cache))
    data = (cache / NAME).read_bytes()
    (cache / NAME).write_bytes(data[: len(data) // 2])
    assert_miss(boot(history(tmp_path), "cached", cache))


def test_unreadable_cache_entry_is_a_miss(tmp_path: Path, cache: Path) -> None:
    (cache / NAME).mkdir(parents=True)  # open() fails with IsADirectoryError
    assert_miss(boot(history(tmp_path), "cached", cache))
    assert answer(boot(history(tmp_path), "store", cache))["ok"]  # runs; cannot replace a dir


# --------------------------------------------------------------------------- where it cannot cache


def test_cache_dir_that_cannot_be_made_still_runs(tmp_path: Path) -> None:
    blocker = tmp_path / "run-file"
    blocker.write_text("a file where the directory's parent should be\n")
    cache = blocker / "launcher"
    assert answer(boot(history(tmp_path), "store", cache))["ok"]
    assert blocker.read_text().startswith("a file")
    assert_miss(boot(history(tmp_path), "cached", cache))


def test_full_filesystem_leaves_no_partial_file(tmp_path: Path, cache: Path) -> None:
    """A write that fails half-way (RLIMIT_FSIZE stands in for a full /run): the op still
    answers, and neither a truncated bundle nor its temp file is left."""

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    assert answer(boot(history(tmp_path), "store", cache, preexec=small_files))["ok"]
    assert list(cache.iterdir()) == []
    assert_miss(boot(history(tmp_path), "cached", cache))


def test_existing_dir_is_made_private(tmp_path: Path, cache: Path) -> None:
    cache.mkdir(parents=True)
    cache.chmod(0o755)  # as the deploy lock's makedirs leaves it
    answer(boot(history(tmp_path), "store", cache))
    assert cache.stat().st_mode & 0o777 == 0o700
    assert (cache / NAME).is_file()


def test_symlinked_cache_dir_is_not_written(tmp_path: Path, cache: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cache.symlink_to(elsewhere)
    assert answer(boot(history(tmp_path), "store", cache))["ok"]
    assert list(elsewhere.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the directory away")
def test_dir_owned_by_someone_else_is_left_alone(tmp_path: Path, cache: Path) -> None:
    cache.mkdir(parents=True, mode=0o755)
    os.chown(cache, 65534, 65534)
    assert answer(boot(history(tmp_path), "store", cache))["ok"]
    assert list(cache.iterdir()) == []
    assert cache.stat().st_mode & 0o777 == 0o755


# --------------------------------------------------------------------------- pruning


def test_store_prunes_all_but_the_newest_bundles(tmp_path: Path, cache: Path) -> None:
    cache.mkdir(parents=True, mode=0o700)
    now = time.time()
    old = [cache / f"agent-{c * 64}.bundle" for c in "abcd"]
    for age, path in enumerate(old, start=1):
        path.write_bytes(b"an older launcher's agent")
        os.utime(path, (now - age * 100, now - age * 100))
    stale_tmp = cache / f".{old[0].name}.{'0' * 12}.tmp"
    fresh_tmp = cache / f".{old[1].name}.{'1' * 12}.tmp"
    for path, seconds in ((stale_tmp, 3600.0), (fresh_tmp, 1.0)):
        path.write_bytes(b"half")
        os.utime(path, (now - seconds, now - seconds))
    (cache / "deploy.lock").write_text("")
    # Compiled copies go with their bundles: the newest old one's stays, the oldest one's goes.
    codes = [cache / p.name.replace(".bundle", ".cpython-39.code") for p in (old[0], old[3])]
    for path in codes:
        path.write_bytes(b"an older launcher's compiled agent")

    assert answer(boot(history(tmp_path), "store", cache))["ok"]
    kept = sorted(p.name for p in cache.iterdir())
    expected = [NAME, CODE, old[0].name, old[1].name, codes[0].name, fresh_tmp.name]
    expected.append("deploy.lock")
    assert kept == sorted(expected)
    assert agent_cache.BUNDLES_KEPT == 3


def test_store_bundle_reports_the_path_it_wrote(tmp_path: Path) -> None:
    path = agent_cache.store_bundle(str(tmp_path / "c"), TEXT)
    assert path == str(tmp_path / "c" / NAME)
    assert agent_cache.store_bundle(str(tmp_path / "missing" / "c"), TEXT) is None


# --------------------------------------------------------------------------- the client


class LocalHost:
    """Runs each `pct exec VMID -- ARGV` here, with the cache in a temp dir, and records what
    was sent: a real host shell for AgentClient, minus SSH and the container."""

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir
        self.sent: list[tuple[str, int, bool]] = []  # (mode, stdin bytes, carried the bundle)

    def _argv(self, command: str, stdin: bytes | None) -> tuple[list[str], bytes]:
        stamped = split_stamped(command)
        assert stamped is not None and stdin is not None
        line = json.loads(stdin)
        mode = "cached" if "bundle" not in line else "store" if "sha256" in line else "source"
        self.sent.append((mode, len(stdin), "bundle" in line))
        line["cache_dir"] = str(self.cache_dir)
        # The host's stamp, as STAMPED_EXEC appends it.
        return [*stamped[1], f"{time.time():.9f}"], (json.dumps(line) + "\n").encode()

    def run(
        self, command: str, *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        argv, data = self._argv(command, stdin)
        proc = subprocess.run(argv, input=data, capture_output=True, timeout=30, check=False)
        return CommandResult(command, proc.returncode, proc.stdout, proc.stderr, 0.0)

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
        argv, data = self._argv(command, stdin)
        with subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        ) as proc:
            assert proc.stdin and proc.stdout and proc.stderr
            proc.stdin.write(data)
            proc.stdin.flush()  # kept open: EOF would tell the agent the client went away
            out = proc.stdout.fileno()
            for chunk in iter(lambda: os.read(out, 65536), b""):
                on_stdout(chunk)
            if on_stderr is not None:
                on_stderr(proc.stderr.read())
            proc.stdin.close()
            return proc.wait(timeout=30)


def client(host: LocalHost, vmid: int = 200) -> AgentClient:
    return AgentClient(Container(host, vmid, label=f"ct{vmid}"))


def test_client_sends_the_bundle_once(tmp_path: Path, cache: Path) -> None:
    host = LocalHost(cache)
    for _ in range(3):
        assert client(host).call(history(tmp_path))["ok"]
    assert [mode for mode, _, _ in host.sent] == ["cached", "store", "cached", "cached"]
    assert all(size < CACHED_LINE for mode, size, _ in host.sent if mode == "cached")
    assert (cache / NAME).is_file()


def test_client_stops_trying_a_container_that_cannot_cache(tmp_path: Path) -> None:
    blocker = tmp_path / "run-file"
    blocker.write_text("not a directory\n")
    host = LocalHost(blocker / "launcher")
    for _ in range(4):
        assert client(host).call(history(tmp_path))["ok"]
    modes = [mode for mode, _, _ in host.sent]
    # Tries the cache until it has sent the bundle and it still missed; then sends it each time.
    assert modes == ["cached", "store", "cached", "store", "store", "store"]
    # Another container on the same host starts again from trying the cache.
    assert client(host, 201).call(history(tmp_path))["ok"]
    assert host.sent[-2][0] == "cached"


def test_follow_uses_the_cache_and_a_miss_streams_nothing(tmp_path: Path, cache: Path) -> None:
    workdir = tmp_path / "wd"
    (workdir / ".launcher").mkdir(parents=True)
    (workdir / ".launcher" / "demo.log").write_bytes(b"step 1\nstep 2\n")
    (workdir / ".launcher" / "demo.exit").write_text("0\n")
    request: FollowRequest = {
        "op": "follow",
        "workdir": str(workdir),
        "session": "demo",
        "offset": 0,
        "heartbeat": 5.0,
        "interval": 0.05,
    }
    host = LocalHost(cache)
    for _ in range(2):
        received = bytearray()
        result = client(host).follow(request, received.extend, idle_timeout=10)
        assert result["ended"] == {"reason": "exited", "exit_code": 0}
        assert bytes(received) == b"step 1\nstep 2\n"  # the miss added nothing to the stream
    assert [mode for mode, _, _ in host.sent] == ["cached", "store", "cached"]
