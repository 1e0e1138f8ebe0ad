"""A redeploy never leaves nothing running, on the sandbox: over a long run, everything the
launch needs is proven before the stop, and launcher's own files are no script destination.

Each case is one a user or a long run produced; none may stop a run and then fail to launch.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.project import Project, json_out

pytestmark = pytest.mark.e2e

VMID = 203
WORKDIR = "/root/safety3"

# A run that filled launcher's 100,000-line tmux history (a line a second for a day), then waits.
LONG_HISTORY = """
import sys, time
for i in range(110_000):
    sys.stdout.write("step=%d loss=1.0 filler line to fill the history\\n" % i)
sys.stdout.flush()
time.sleep(600)
"""

# A run that printed one 10 MB line.
HUGE_LINE = """
import sys, time
sys.stdout.write("x" * 10_000_000 + "\\n")
sys.stdout.flush()
time.sleep(600)
"""


def ct_ok(project: Project, *argv: str) -> str:
    result = project.ct(VMID, *argv)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


def pane_pid(project: Project, session: str) -> str:
    return ct_ok(project, "tmux", "display-message", "-p", "-t", f"={session}:", "#{pane_pid}")


def write_script(project: Project, name: str, text: str) -> Path:
    path = project.root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def clean_ct(project: Project) -> Iterator[Project]:
    yield project
    project.ct(VMID, "tmux", "kill-server")
    project.ct(VMID, "pkill", "-KILL", "-f", "[r]un.py|[t]rain_demo")
    project.ct(VMID, "rm", "-rf", WORKDIR)


def scripted(project: Project, name: str, text: str) -> dict[str, object]:
    book = project.playbook(name, workdir=WORKDIR, gpus=0)
    book["script"] = {"source": str(write_script(project, f"{name}.py", text)), "dest": "run.py"}
    book["command"] = "python3 run.py"
    return book


def history_size(project: Project, session: str) -> int:
    out = ct_ok(project, "tmux", "display-message", "-p", "-t", f"={session}:", "#{history_size}")
    return int(out.strip() or 0)


@pytest.mark.parametrize(
    ("script", "filled"),
    [(LONG_HISTORY, lambda n: n >= 95_000), (HUGE_LINE, lambda n: n >= 1)],
    ids=["100k-lines", "10MB-line"],
)
def test_a_redeploy_over_a_long_run_leaves_the_new_run_running(
    clean_ct: Project, script: str, filled: object
) -> None:
    project = clean_ct
    book = scripted(project, "longrun", script)
    project.write({"longrun": (VMID, book)})
    assert project.launcher("deploy").returncode == 0
    project.wait_for(
        lambda: filled(history_size(project, "longrun")),  # type: ignore[operator]
        timeout=60,
        what="the run's history to fill",
    )
    old = pane_pid(project, "longrun")
    for attempt in range(3):
        result = project.launcher("deploy", "--restart", "--json")
        assert result.returncode == 0, (attempt, result.stdout, result.stderr)
        launched = json_out(result)["result"]["launched"]
        assert launched and launched["pane_pid"], result.stdout
        new = pane_pid(project, "longrun")
        assert new != old and new.strip() == str(launched["pane_pid"])
        project.wait_for(
            lambda: filled(history_size(project, "longrun")),  # type: ignore[operator]
            timeout=60,
            what="the new run's history to fill",
        )
        old = new


def test_an_env_value_over_the_per_string_limit_is_refused_before_the_stop(
    clean_ct: Project,
) -> None:
    project = clean_ct
    book = project.playbook("argmax", workdir=WORKDIR, gpus=0)
    project.write({"argmax": (VMID, book)})
    assert project.launcher("deploy").returncode == 0
    pid = pane_pid(project, "argmax")
    # 130 KiB: under the 1 MiB total, over Linux's 128 KiB for one string (MAX_ARG_STRLEN).
    book["env"]["BIG"] = "v" * (130 * 1024)  # type: ignore[index]
    project.write({"argmax": (VMID, book)})
    result = project.launcher("deploy", "--restart")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "BIG" in result.stderr and "131072" in result.stderr
    assert pane_pid(project, "argmax") == pid, "the healthy run must not be stopped"
    archived = ct_ok(project, "sh", "-c", f"ls {WORKDIR} | grep -c archived || true")
    assert archived.strip() == "0", "checkpoints must not be moved"


def test_an_env_value_just_under_the_limit_starts(clean_ct: Project) -> None:
    project = clean_ct
    book = project.playbook("argfits", workdir=WORKDIR, gpus=0)
    # "BIG=" + value + NUL is exactly 128 KiB: exec takes it.
    book["env"]["BIG"] = "v" * (128 * 1024 - 5)
    project.write({"argfits": (VMID, book)})
    result = project.launcher("deploy")
    assert result.returncode == 0, result.stdout + result.stderr
    project.wait_for(
        lambda: "step=" in project.launcher("logs", "--tail", "5").stdout,
        what="the trainer to start",
    )


@pytest.mark.parametrize(
    "dest",
    [".launcher/deploys.jsonl", ".launcher/destdir.log", "./.launcher/x.py", "checkpoints/x.py"],
)
def test_a_script_dest_among_launchers_own_files_is_refused(clean_ct: Project, dest: str) -> None:
    project = clean_ct
    book = project.playbook("destdir", workdir=WORKDIR, gpus=0)
    project.write({"destdir": (VMID, book)})
    assert project.launcher("deploy").returncode == 0
    pid = pane_pid(project, "destdir")
    book["script"]["dest"] = dest  # type: ignore[index]
    project.write({"destdir": (VMID, book)})
    for argv in (("inventory", "check"), ("deploy", "--restart")):
        result = project.launcher(*argv)
        assert result.returncode == 2, (argv, result.stdout + result.stderr)
        assert "Traceback" not in result.stderr
    assert pane_pid(project, "destdir") == pid
    book["script"]["dest"] = "train_demo.py"  # type: ignore[index]
    project.write({"destdir": (VMID, book)})
    history = project.launcher("history", "--json")
    assert history.returncode == 0 and "destdir:" in history.stdout, "deploy history kept"


def test_a_script_dest_that_is_a_directory_or_symlinked_in_is_refused(clean_ct: Project) -> None:
    project = clean_ct
    book = project.playbook("destdir", workdir=WORKDIR, gpus=0)
    project.write({"destdir": (VMID, book)})
    assert project.launcher("deploy").returncode == 0
    pid = pane_pid(project, "destdir")
    ct_ok(project, "mkdir", "-p", f"{WORKDIR}/adir")
    ct_ok(project, "ln", "-sfn", f"{WORKDIR}/.launcher", f"{WORKDIR}/state-link")
    for dest, reason in (("adir", "directory"), ("state-link/x.py", ".launcher")):
        book["script"]["dest"] = dest  # type: ignore[index]
        project.write({"destdir": (VMID, book)})
        result = project.launcher("deploy", "--restart")
        assert result.returncode == 2, (dest, result.stdout + result.stderr)
        assert reason in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
        assert pane_pid(project, "destdir") == pid
    assert ct_ok(project, "ls", f"{WORKDIR}/adir") == ""


# A crash whose last words are one 300 KB line.
HUGE_CRASH = """
import sys, time
print("starting", flush=True)
time.sleep(2)
sys.stdout.write("RuntimeError: " + "z" * 300_000 + "\\n")
sys.stdout.flush()
sys.exit(1)
"""


def read(path: Path) -> str:
    return path.read_text(errors="replace")


class Hooks:
    """Three webhook receivers on 127.0.0.1: one that answers, one that trickles its answer a
    byte every few seconds (never finishing in time), one that redirects a POST with 302."""

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []
        self.gets: list[str] = []
        posts, gets = self.posts, self.gets

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.startswith("/slow"):
                    self.wfile.write(b"H")
                    for _ in range(30):
                        time.sleep(2)
                        self.wfile.write(b"T")
                        self.wfile.flush()
                    return
                if self.path.startswith("/moved"):
                    self.send_response(302)
                    self.send_header("Location", "/landed")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                posts.append(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                gets.append(self.path)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_watch_keeps_secrets_and_delivers_past_slow_hooks_and_huge_lines(
    clean_ct: Project, tmp_path: Path
) -> None:
    project = clean_ct
    book = scripted(project, "wsafe", HUGE_CRASH)
    book["verify"] = {"wait": 1, "interval": 1, "window": 30, "successes": 1, "lines": 500}
    project.write({"wsafe": (VMID, book)})
    hooks = Hooks()
    token = "T0KEN" + "s3cr3t" * 4
    got = tmp_path / "exec-event.json"
    receiver = tmp_path / "receive.sh"
    receiver.write_text(f"#!/bin/sh\ncat > {got}\n")
    receiver.chmod(0o755)
    state = tmp_path / "state"
    env = {**os.environ, "XDG_STATE_HOME": str(state)}
    argv = project.argv("watch", "--for", "40")
    argv += ["--webhook", f"{hooks.base}/slow/{token}", "--webhook", f"{hooks.base}/moved/{token}"]
    argv += ["--webhook", f"{hooks.base}/ok/{token}", "--exec", str(receiver)]
    try:
        assert project.launcher("deploy").returncode == 0
        started = time.monotonic()
        errors = (tmp_path / "watch.err").open("w+b")
        watch = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=errors, env=env)
        try:
            project.wait_for(
                lambda: got.exists() and got.stat().st_size > 0, 40, "the --exec event"
            )
        except AssertionError:
            watch.kill()
            text = (tmp_path / "watch.err").read_text()
            raise AssertionError(re.sub("z{100,}", "z…", text)[-3000:]) from None
        project.wait_for(lambda: hooks.posts, 40, "the webhook that answers")
        # Neither waited for the trickling hook's 60 s: concurrent destinations, bounded tries.
        assert time.monotonic() - started < 30
        # Both failing hooks reported (the trickling one after its one-try deadline), then
        # SIGTERM rather than --for's end: the slow hook's retry may still be queued, so the
        # outbox in the state dir holds its URL too (the token checks below cover it).
        project.wait_for(
            lambda: all(w in read(tmp_path / "watch.err") for w in ("HTTP 302", "no answer")),
            40,
            "both failing webhooks reported",
        )
        watch.send_signal(signal.SIGTERM)
        assert watch.wait(timeout=60) == 0
        err = (tmp_path / "watch.err").read_text()
        assert len(err) < 100_000, "the huge line is cut on stderr too"
    finally:
        hooks.close()
    event = json.loads(got.read_text())
    assert event["kind"] == "unhealthy"
    body = hooks.posts[0]
    for doc in (event, body):
        text = json.dumps(doc)
        assert len(text) < 100_000 and "[cut: " in text, len(text)
    assert hooks.gets == [], "a 302 must not turn the POST into a GET counted as delivered"
    assert "HTTP 302" in err and "no answer within" in err, err
    assert token not in err
    files = [p for p in (state / "launcher" / "watch").iterdir()]
    assert files and all(token not in p.read_text(errors="replace") for p in files)
    assert {oct(p.stat().st_mode & 0o777) for p in files} == {"0o600"}
    assert oct((state / "launcher" / "watch").stat().st_mode & 0o777) == "0o700"


# Status lines whose throughput overflows to infinity (1e308 Mtok/s) among ordinary ones.
INFINITE_RATE = """
import time
i = 0
while True:
    i += 1
    rate = "1e308Mtok/s" if i % 2 else "%.1fKtok/s" % (10 + i)
    print("[0m] step=%d loss=%.3f lr=1e-4 | tgt=1b/s (%s) | q_pre=[8, 6] q_hs=[4] ETA=1d"
          % (i, 5.0 - i * 0.01, rate), flush=True)
    time.sleep(0.3)
"""


def strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_json_and_the_report_carry_no_nan_or_infinity(clean_ct: Project, tmp_path: Path) -> None:
    project = clean_ct
    book = scripted(project, "infrate", INFINITE_RATE)
    project.write({"infrate": (VMID, book)})
    assert project.launcher("deploy").returncode == 0
    project.wait_for(
        lambda: all(rate in project.launcher("logs").stdout for rate in ("1e308Mtok/s", "Ktok/s")),
        what="status lines with an infinite and an ordinary rate",
    )
    report = tmp_path / "report.html"
    verify = project.launcher("verify", "--json", "--wait", "3", "--report", str(report))
    assert verify.returncode in (0, 1), verify.stderr
    status = project.launcher("status", "--json")
    for result in (verify, status):
        document = strict_json(result.stdout)
        samples = document["samples"]
        assert any("throughput" in (s.get("nonfinite") or []) for s in samples), samples
        assert all(s["throughput"] is None or s["throughput"] < 1e300 for s in samples)
    page = report.read_text()
    assert 'nan"' not in page.lower() and 'inf"' not in page.lower()
    assert 'class="nonfinite"' in page


@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
def test_an_identity_file_that_never_ends_is_refused_at_once(
    clean_ct: Project, tmp_path: Path, kind: str
) -> None:
    project = clean_ct
    key = "/dev/zero"
    if kind == "fifo":
        key = str(tmp_path / "key.fifo")
        os.mkfifo(key)
    project.write(
        {"keyz": (VMID, project.playbook("keyz", workdir=WORKDIR))},
        host=project.host(identity_file=key, connect_timeout=3),
    )
    started = time.monotonic()
    result = project.launcher("status", timeout=60)
    assert time.monotonic() - started < 20
    assert result.returncode == 2, result.stdout + result.stderr
    assert "regular file" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("kind", ["6GiB", "fifo", "dev-zero"])
def test_a_script_source_too_large_or_not_a_file_is_refused_before_anything(
    clean_ct: Project, tmp_path: Path, kind: str
) -> None:
    project = clean_ct
    book = project.playbook("bigsrc", workdir=WORKDIR, gpus=0)
    project.write({"bigsrc": (VMID, book)})
    assert project.launcher("deploy").returncode == 0
    pid = pane_pid(project, "bigsrc")
    source = tmp_path / "huge.py"
    if kind == "6GiB":
        with source.open("wb") as handle:
            handle.truncate(6 << 30)  # sparse: 6 GiB to read, nothing on disk
    elif kind == "fifo":
        os.mkfifo(source)
    else:
        source = Path("/dev/zero")
    book["script"]["source"] = str(source)  # type: ignore[index]
    project.write({"bigsrc": (VMID, book)})
    started = time.monotonic()
    for argv in (("inventory", "check"), ("deploy", "--restart")):
        result = project.launcher(*argv, timeout=60)
        assert result.returncode == 2, (argv, result.stdout + result.stderr)
        assert "Traceback" not in result.stderr
    assert time.monotonic() - started < 30
    assert pane_pid(project, "bigsrc") == pid


@pytest.mark.parametrize("address", ["127.0.0.1:22", "host name", "ssh://127.0.0.1"])
def test_an_address_with_a_port_or_a_scheme_is_a_config_error(
    clean_ct: Project, address: str
) -> None:
    project = clean_ct
    project.write(
        {"addr": (VMID, project.playbook("addr", workdir=WORKDIR))},
        host=project.host(address=address),
    )
    for argv in (("inventory", "check"), ("status",)):
        result = project.launcher(*argv)
        assert result.returncode == 2, (argv, result.stdout + result.stderr)
        assert "Traceback" not in result.stderr and "address" in result.stderr


API_CALLS = [
    ("Launcher(5)", "inventory="),
    ("l.verify(wait='ten')", "wait="),
    ("l.verify(wait=-5)", "wait="),
    ("l.verify(wait=float('nan'))", "wait="),
    ("l.verify(interval=0)", "interval="),
    ("l.verify(successes=True)", "successes="),
    ("l.logs(tail=-1)", "tail="),
    ("l.logs(tail='abc')", "tail="),
    ("l.stop(grace=float('inf'))", "grace="),
    ("l.deploy(checkpoints='shred')", "checkpoints="),
    ("l.history(limit=2.5)", "limit="),
    ("l.status(5)", "target="),
]


@pytest.mark.parametrize(("call", "named"), API_CALLS)
def test_the_api_checks_its_arguments_as_the_cli_does(
    clean_ct: Project, call: str, named: str
) -> None:
    project = clean_ct
    project.write({"apiargs": (VMID, project.playbook("apiargs", workdir=WORKDIR))})
    program = (
        "import sys\n"
        "from launcher import Launcher\n"
        "from launcher.core.errors import LauncherError\n"
        f"l = Launcher({str(project.inventory)!r})\n"
        "try:\n"
        f"    {call}\n"
        "except LauncherError as exc:\n"
        "    print(int(exc.exit_code), exc)\n"
        "    sys.exit(0)\n"
        "sys.exit('no LauncherError')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("2 ") and named in result.stdout, result.stdout


def test_cli_inputs_that_were_tracebacks_are_usage_errors(
    clean_ct: Project, tmp_path: Path
) -> None:
    project = clean_ct
    project.write({"inputs": (VMID, project.playbook("inputs", workdir=WORKDIR))})
    webhook = project.launcher("watch", "--for", "1", "--webhook", "http://[::1")
    assert webhook.returncode == 2 and "Traceback" not in webhook.stderr, webhook.stderr
    state = tmp_path / "state.json"
    for damaged in ('{"targets": {"inputs": 5}}', "[1, 2]", '{"outbox": {"x": {"event": 1}}}'):
        state.write_text(damaged)
        result = project.launcher("watch", "--for", "1", "--state", str(state))
        assert result.returncode == 2, (damaged, result.stdout + result.stderr)
        assert "Traceback" not in result.stderr and "watch state" in result.stderr
    fab = Path(sys.executable).with_name("fab")
    workdir = tmp_path / "fab"
    workdir.mkdir()
    fabfile = Path(__file__).parent / "fabfile_project" / "fabfile.py"
    (workdir / "fabfile.py").write_text(fabfile.read_text())
    logs = subprocess.run(
        [str(fab), "logs", "--tail", "abc", "-i", str(project.inventory)],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert logs.returncode == 2, logs.stdout + logs.stderr
    assert "Traceback" not in logs.stderr and "abc" in logs.stderr


MAIN = str(Path("launcher", "__main__.py"))


def test_ctrl_c_while_launcher_starts_exits_130_without_a_traceback(clean_ct: Project) -> None:
    project = clean_ct
    project.write({"ctrlc": (VMID, project.playbook("ctrlc", workdir=WORKDIR))})
    for delay in (0.05, 0.1, 0.15, 0.2, 0.3):
        proc = subprocess.Popen(
            project.argv("status"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        if "init_import_site" in err or ("_get_module_details" in err and MAIN not in err):
            # Python's own start (site, or `-m` importing the package before launcher/__main__.py
            # runs, which it reaches within 50 ms once the bytecode is compiled): no line of
            # launcher that could catch it has run yet
            continue
        if proc.returncode == -signal.SIGINT and not err:
            continue  # so early that the interpreter had not yet installed its SIGINT handler
        assert "Traceback" not in err, (delay, err)
        assert proc.returncode in (130, 0, 1), (delay, proc.returncode, err)


def test_doctor_is_bounded_by_the_hosts_command_timeout(clean_ct: Project) -> None:
    project = clean_ct
    project.write(
        {"hung": (VMID, project.playbook("hung", workdir=WORKDIR))},
        host=project.host(command_timeout=3),
    )
    project.sandbox.set_faults(pct_latency=30)  # every pct call hangs for 30 s
    started = time.monotonic()
    result = project.launcher("doctor", timeout=90)
    took = time.monotonic() - started
    project.sandbox.set_faults()
    assert result.returncode == 3, result.stdout + result.stderr
    assert took < 20, took


# Crashes once (its first run), then prints status lines for good.
CRASH_ONCE = """
import os, sys, time
if not os.path.exists("crashed-once"):
    open("crashed-once", "w").close()
    print("[0m] step=1 loss=5.0 lr=1e-4 | tgt=1b/s (10.0Ktok/s)", flush=True)
    time.sleep(2)
    print("RuntimeError: NCCL error (crash once)", flush=True)
    sys.exit(1)
i = 0
while True:
    i += 1
    print("[0m] step=%d loss=%.3f lr=1e-4 | tgt=1b/s (%.1fKtok/s) | "
          "q_pre=[8, 6, 6, 5, 4, 4] q_hs=[4]" % (i, 5.0 - i * 0.01, 10.0 + i), flush=True)
    time.sleep(0.5)
"""


def test_two_watchers_with_their_own_state_restart_a_crash_once(
    clean_ct: Project, tmp_path: Path
) -> None:
    project = clean_ct
    ct_ok(project, "rm", "-rf", WORKDIR)
    book = scripted(project, "twowatch", CRASH_ONCE)
    book["verify"] = {"wait": 1, "interval": 1, "window": 30, "successes": 1, "lines": 200}
    project.write({"twowatch": (VMID, book)})
    watchers = []
    for n in range(2):
        env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / f"state{n}")}
        argv = project.argv("watch")
        argv += ["--restart-on-failure", "--restart-backoff", "0", "--for", "25"]
        err = (tmp_path / f"watch{n}.err").open("w")
        watchers.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env))
    project.wait_for(
        lambda: all("watching" in read(tmp_path / f"watch{n}.err") for n in range(2)),
        30,
        "both watching before the run starts",
    )
    assert project.launcher("deploy").returncode == 0

    def records() -> list[Any]:
        history = json_out(project.launcher("history", "--json"))
        return history["records"] if isinstance(history, dict) else history  # type: ignore[no-any-return]

    # The restart, then a window of several polls (interval 1 s) in which a second watcher's
    # restart would land: it decides at the crash and at worst waits out the first's deploy
    # (its lock), so a duplicate shows within seconds, not at --for's end.
    project.wait_for(lambda: len(records()) >= 2, 40, "the restart")
    time.sleep(8)
    for watcher in watchers:
        watcher.send_signal(signal.SIGTERM)
        watcher.wait(timeout=90)
    errors = [(tmp_path / f"watch{n}.err").read_text() for n in range(2)]
    found = records()
    assert len(found) == 2, (found, errors)  # the deploy and one restart, not two
    assert sum("restart not needed" in e for e in errors) <= 1, errors


CRASH_ALWAYS = """
import sys, time
print("starting", flush=True)
time.sleep(1.5)
print("RuntimeError: CUDA error (crash loop)", flush=True)
sys.exit(1)
"""


def test_watch_for_exits_non_zero_while_the_target_crash_loops(
    clean_ct: Project, tmp_path: Path
) -> None:
    project = clean_ct
    book = scripted(project, "crashloop", CRASH_ALWAYS)
    book["verify"] = {"wait": 1, "interval": 1, "window": 30, "successes": 1, "lines": 200}
    project.write({"crashloop": (VMID, book)})
    assert project.launcher("deploy").returncode == 0
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    argv = project.argv("watch", "--for", "14")
    argv += ["--restart-on-failure", "--max-restarts", "50", "--restart-backoff", "0"]
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=90, check=False)
    assert "restart" in result.stderr, result.stderr
    assert result.returncode == 1, result.stderr
