"""Nothing lost, on the sandbox: launcher deletes only what it made, prunes no checkpoint
archive without the user's word, checks the command before the stop, and holds at the edges
(closed output streams, odd project trees, a watcher killed mid-restart).

Each case is one a user or a hostile tester produced; on the code before, each lost something.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from launcher.agent.protocol import LOCK_PATH
from launcher.sandbox import Sandbox
from tests.e2e.conftest import missing_requirements
from tests.e2e.project import Project, json_out

pytestmark = pytest.mark.e2e


def sandbox_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launcher", "sandbox", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def snapshot(folder: Path) -> list[tuple[str, bytes]]:
    return sorted(
        (str(p.relative_to(folder)), p.read_bytes() if p.is_file() else b"")
        for p in folder.rglob("*")
    )


# -- 1. sandbox down deletes only what the sandbox made


def test_sandbox_down_refuses_a_directory_it_did_not_make(tmp_path: Path) -> None:
    """A mistyped --state-dir (or LAUNCHER_SANDBOX_DIR) pointing at someone's files."""
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    folder = tmp_path / "home"
    (folder / "lxc").mkdir(parents=True)  # even names a sandbox uses
    (folder / "inventory.yaml").write_text("hosts: {}\n")
    (folder / "thesis.tex").write_text("years of work\n")
    before = snapshot(folder)
    down = sandbox_cli("down", "--state-dir", str(folder))
    assert down.returncode == 2, down.stdout + down.stderr
    assert f"refusing to remove {folder}: it has no .launcher-sandbox" in down.stderr
    assert "sandbox removed" not in down.stdout
    assert snapshot(folder) == before
    up = sandbox_cli("up", "--vmid", "320", "--state-dir", str(folder))
    assert up.returncode == 2, up.stdout + up.stderr
    assert "is not a sandbox's state dir" in up.stderr
    assert snapshot(folder) == before


def test_sandbox_down_keeps_a_users_files_in_its_state_dir(tmp_path: Path) -> None:
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    state = tmp_path / "sandbox"
    sb = Sandbox(state)
    try:
        sb.up([310], gpus=1)
        (state / "notes.md").write_text("how I set this up\n")
        (state / "playbooks" / "mine.yaml").write_text("name: mine\n")
        down = sandbox_cli("down", "--state-dir", str(state))
    finally:
        if (state / ".launcher-sandbox").exists():
            sb.down()
    assert down.returncode == 0, down.stdout + down.stderr
    assert "kept what it did not make: notes.md, playbooks/mine.yaml" in down.stdout
    assert (state / "notes.md").read_text() == "how I set this up\n"
    assert (state / "playbooks" / "mine.yaml").read_text() == "name: mine\n"
    assert sorted(p.name for p in state.iterdir()) == [".launcher-sandbox", "notes.md", "playbooks"]
    assert not (state / "lxc").exists() and not (state / "id_ed25519").exists()
    states = subprocess.run(
        ["lxc-info", "-n", "310", "-P", str(state / "lxc"), "-s"], capture_output=True, check=False
    )
    assert b"RUNNING" not in states.stdout
    assert not sb.status().sshd_alive


# -- 2. no checkpoint archive pruned without the user's word

VMID = 203


# Writes $CKPTS checkpoint files of $CKPT_KB KiB each, then runs on; what a trainer leaves.
CHECKPOINTER = """
import os, sys, time
os.makedirs("checkpoints", exist_ok=True)
for i in range(int(os.environ["CKPTS"])):
    with open("checkpoints/step_%d.pt" % i, "wb") as f:
        f.write(b"w" * 1024 * int(os.environ.get("CKPT_KB", "1")))
print("step=1 loss=1.0", flush=True)
time.sleep(600)
"""


@pytest.fixture
def clean_ct(project: Project) -> Iterator[Project]:
    yield project
    project.ct(VMID, "tmux", "kill-server")
    project.ct(VMID, "pkill", "-KILL", "-f", "[r]un.py|[t]rain_demo")
    for workdir in WORKDIRS:
        project.ct(VMID, "umount", "-l", workdir)
        project.ct(VMID, "rm", "-rf", workdir)


ARCHIVES_WORKDIR = "/root/safety4-archives"
DISK_WORKDIR = "/root/safety4-disk"
COMMAND_WORKDIR = "/root/safety4-command"
EDGE_WORKDIR = "/root/safety4-edges"
WORKDIRS = (ARCHIVES_WORKDIR, DISK_WORKDIR, COMMAND_WORKDIR, "/root/safety4-watch", EDGE_WORKDIR)


def checkpointer(project: Project, name: str, workdir: str, **overrides: Any) -> dict[str, Any]:
    script = project.root / "run.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(CHECKPOINTER)
    book = project.playbook(name, workdir=workdir, gpus=0, **overrides)
    book["script"] = {"source": str(script), "dest": "run.py"}
    book["command"] = "python3 run.py"
    return book


def archives_in(project: Project, workdir: str) -> list[str]:
    out = project.ct_text(VMID, "ls", "-1", workdir)
    return sorted(n for n in out.split() if n.startswith("checkpoints.archived-"))


def checkpoint_files(project: Project, folder: str) -> int:
    return len(project.ct_text(VMID, "ls", "-1", folder).split())


def test_a_long_runs_archive_outlives_quick_redeploys_unless_pruning_is_asked(
    clean_ct: Project,
) -> None:
    """keep_archives: 2, a run with 20 checkpoints, then three quick fix-a-typo redeploys."""
    project = clean_ct
    project.write({"arch": (VMID, checkpointer(project, "arch", ARCHIVES_WORKDIR,
                                               keep_archives=2))})  # fmt: skip
    ckpts = f"{ARCHIVES_WORKDIR}/checkpoints"

    def deployed(count: int) -> subprocess.CompletedProcess[str]:
        done = project.launcher("deploy", "--restart", "--env", f"CKPTS={count}")
        assert done.returncode == 0, done.stderr
        project.wait_for(lambda: checkpoint_files(project, ckpts) == count, 30, "checkpoints")
        return done

    deployed(20)
    time.sleep(6)  # the long run: it lives longer than the quick ones after it
    for _ in range(3):
        quick = deployed(1)
    archives = archives_in(project, ARCHIVES_WORKDIR)
    assert len(archives) == 3, archives
    long_run = f"{ARCHIVES_WORKDIR}/{archives[0]}"
    assert checkpoint_files(project, long_run) == 20  # kept beyond the limit
    # (How long each run lived depends on this machine's load; the count does not.)
    assert f"kept {long_run} beyond keep_archives 2: its run " in quick.stderr
    assert "holds more checkpoints (20) than theirs (at most 1)" in quick.stderr
    assert "deploy with --prune-archives to prune it" in quick.stderr

    pruning = project.launcher("deploy", "--restart", "--env", "CKPTS=1", "--prune-archives",
                               "--json")  # fmt: skip
    assert pruning.returncode == 0, pruning.stderr
    pruned = json_out(pruning)["result"]["checkpoints"]["pruned"]
    assert pruned == [f"{ARCHIVES_WORKDIR}/{archives[1]}", long_run]
    assert f"pruned (keep_archives 2): {', '.join(pruned)}" in pruning.stderr
    left = archives_in(project, ARCHIVES_WORKDIR)
    assert len(left) == 2 and left[0] == archives[2], left
    history = project.launcher("history", "--limit", "1")
    assert f"pruned       {long_run}" in history.stdout, history.stdout
    records = json_out(project.launcher("history", "--limit", "1", "--json"))
    assert records["records"][0]["checkpoints"]["pruned"] == pruned


def test_a_disk_that_will_not_hold_the_new_run_is_said_before_the_stop(
    clean_ct: Project,
) -> None:
    """Archiving frees nothing and the new run writes as much again: refused, not pruned."""
    project = clean_ct
    assert project.ct(VMID, "mkdir", "-p", DISK_WORKDIR).returncode == 0
    mount = project.ct(VMID, "mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", DISK_WORKDIR)
    assert mount.returncode == 0, mount.stderr
    project.write({"disk": (VMID, checkpointer(project, "disk", DISK_WORKDIR,
                                               keep_archives=1))})  # fmt: skip
    first = project.launcher("deploy", "--restart", "--env", "CKPTS=15", "--env", "CKPT_KB=1024")
    assert first.returncode == 0, first.stderr
    project.wait_for(lambda: checkpoint_files(project, f"{DISK_WORKDIR}/checkpoints") == 15)
    pane = project.ct_text(VMID, "tmux", "display-message", "-p", "-t", "=disk:", "#{pane_pid}")
    again = project.launcher("deploy", "--restart", "--env", "CKPTS=1")
    assert again.returncode == 3, again.stderr
    assert "the disk will not hold the new run: " in again.stderr
    assert "the run it replaces wrote 15.0 MiB of checkpoints" in again.stderr
    assert "Nothing was stopped" in again.stderr
    after = project.ct_text(VMID, "tmux", "display-message", "-p", "-t", "=disk:", "#{pane_pid}")
    assert after == pane  # the old run untouched
    assert archives_in(project, DISK_WORKDIR) == []
    assert checkpoint_files(project, f"{DISK_WORKDIR}/checkpoints") == 15


# -- 3. the command checked before the stop


def pane_pid(project: Project, session: str) -> str:
    out = project.ct_text(
        VMID, "tmux", "display-message", "-p", "-t", f"={session}:", "#{pane_pid}"
    )
    assert out.strip(), f"no session {session}"
    return out


@pytest.mark.parametrize(
    ("command", "named"),
    [
        ("python3 trian.py", "the command's script trian.py does not exist"),
        ("pyhton3 run.py", "the command's program pyhton3 is not found on the run's PATH"),
        ("python3 -m trainr", "the command's module trainr is not found by "),
        ("torchrun --nproc_per_node 1 trian.py", "the command's script trian.py does not exist"),
    ],
    ids=["script", "program", "module", "torchrun"],
)
def test_a_typo_in_the_command_is_refused_before_the_stop(
    clean_ct: Project, command: str, named: str
) -> None:
    project = clean_ct
    book = checkpointer(project, "cmd", COMMAND_WORKDIR)
    project.write({"cmd": (VMID, book)})
    first = project.launcher("deploy", "--restart", "--env", "CKPTS=1")
    assert first.returncode == 0, first.stderr
    before = pane_pid(project, "cmd")
    typo = project.launcher("deploy", "--restart", "--command", command)
    assert typo.returncode == 2, typo.stderr
    assert named in typo.stderr and f"command: {command}" in typo.stderr, typo.stderr
    assert "✓ stop" not in typo.stderr and "deployed" not in typo.stdout
    assert pane_pid(project, "cmd") == before  # the old run untouched
    assert project.ct(VMID, "test", "-d", f"{COMMAND_WORKDIR}/checkpoints").returncode == 0
    assert archives_in(project, COMMAND_WORKDIR) == []


def test_a_project_commands_script_is_looked_for_in_the_new_release(clean_ct: Project) -> None:
    """The old release has main.py; the new one renamed it: refused before the stop, though
    `current` (the old release, until the switch) still has it."""
    project = clean_ct
    src = project.root / "proj"
    src.mkdir(parents=True)
    (src / "main.py").write_text(CHECKPOINTER)
    book = project.playbook("proj", workdir=COMMAND_WORKDIR, gpus=0, env={"CKPTS": "1"})
    del book["script"]
    book["project"] = {"source": str(src)}
    book["command"] = "python3 main.py"
    project.write({"proj": (VMID, book)})
    first = project.launcher("deploy", "--restart")
    assert first.returncode == 0, first.stderr
    before = pane_pid(project, "proj")
    (src / "main.py").rename(src / "train.py")
    renamed = project.launcher("deploy", "--restart")
    assert renamed.returncode == 2, renamed.stderr
    assert "the command's script main.py does not exist" in renamed.stderr
    assert "/releases/" in renamed.stderr and "command: python3 main.py" in renamed.stderr
    assert pane_pid(project, "proj") == before
    fixed = project.launcher("deploy", "--restart", "--command", "python3 train.py")
    assert fixed.returncode == 0, fixed.stderr


# -- 9. a watcher killed mid-restart leaves its count to the next


def watch_record(state_home: Path, target: str) -> dict[str, Any]:
    for path in (state_home / "launcher" / "watch").glob("*.json"):
        try:
            found: dict[str, Any] = json.loads(path.read_text())["targets"].get(target) or {}
        except (OSError, ValueError):
            continue  # being replaced
        return found
    return {}


def deploy_lock_held(project: Project, vmid: int) -> bool:
    """Whether a deploy holds the CT's deploy lock now, as the host's /proc/locks shows it:
    reading takes no lock, so it cannot get in the deploy's way."""
    init = subprocess.run(
        ["lxc-info", "-n", str(vmid), "-P", str(project.sandbox.lxcpath), "-p", "-H"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        lock = os.stat(f"/proc/{init}/root{LOCK_PATH}")
    except FileNotFoundError:
        return False
    inode = f"{os.major(lock.st_dev):02x}:{os.minor(lock.st_dev):02x}:{lock.st_ino}"
    return any(inode in line.split() for line in Path("/proc/locks").read_text().splitlines())


def test_a_watcher_killed_mid_restart_leaves_its_count_to_the_next(
    clean_ct: Project, tmp_path: Path
) -> None:
    """--max-restarts 1: the first watcher's restart is under way (the old run ignores C-c, so
    the stop waits its grace) when it is killed; the deploy finishes in the container. The next
    watcher counts the run it launched as the first's, so the next failure is the budget's end
    (left stopped), not a third deploy."""
    project = clean_ct
    book = project.playbook(
        "wkill", workdir="/root/safety4-watch", gpus=0, stop_grace=4,
        env={"DEMO_MODE": "nan", "DEMO_NAN_AFTER": "4", "DEMO_IGNORE_SIGINT": "1"},
        verify={"wait": 1, "interval": 1, "successes": 1, "failure_threshold": 2},
    )  # fmt: skip
    project.write({"wkill": (VMID, book)})
    assert project.launcher("deploy", "--restart").returncode == 0
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    argv = project.argv("watch", "--restart-on-failure", "--max-restarts", "1")
    argv += ["--restart-backoff", "0", "--for", "40"]
    first = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        project.wait_for(
            lambda: watch_record(tmp_path / "state", "wkill").get("status") == "restarting",
            40,
            "the first watcher's restart",
        )
        # The restart's deploy under way in the container (then in the stop's grace).
        project.wait_for(lambda: deploy_lock_held(project, VMID), 20, "the restart's deploy")
    finally:
        first.kill()
        first.wait(timeout=30)

    def records() -> list[Any]:
        found: list[Any] = json_out(project.launcher("history", "--json"))["records"]
        return found

    project.wait_for(lambda: len(records()) == 2, 30, "the killed watcher's restart to finish")
    second = subprocess.run(
        [*argv[:-1], "25"], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    found = records()
    assert len(found) == 2, (found, second.stderr)  # the deploy and the one restart allowed
    assert "redeployed" not in second.stderr, second.stderr
    assert "restarts in" in second.stderr and "the limit" in second.stderr, second.stderr


# -- 9. closed or broken output streams, odd project trees


def with_closed(redirection: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """argv run with a standard stream closed by the shell (`>&-`, `2>&-`)."""
    return subprocess.run(
        ["bash", "-c", f'"$@" {redirection}', "bash", *argv],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_closed_stdout_or_stderr_leaves_the_commands_own_exit_code(clean_ct: Project) -> None:
    project = clean_ct
    book = project.playbook("edges", workdir=EDGE_WORKDIR, gpus=0)
    project.write({"edges": (VMID, book)})
    deployed = with_closed(">&-", project.argv("deploy", "--restart"))
    assert deployed.returncode == 0, deployed.stderr
    assert "Traceback" not in deployed.stderr and "deployed edges" not in deployed.stdout
    assert pane_pid(project, "edges")  # it did launch
    project.wait_for(lambda: project.launcher("status").returncode == 0, 30, "a healthy run")
    for redirection in (">&-", "2>&-", ">&- 2>&-", "<&-"):
        status = with_closed(redirection, project.argv("status", "--json"))
        assert status.returncode == 0, (redirection, status.stderr)
        assert "Traceback" not in status.stderr
    missing = with_closed(">&- 2>&-", project.argv("logs", "-t", "nosuchtarget"))
    assert missing.returncode == 2  # a usage error stays one


def test_a_reader_of_stderr_that_goes_away_does_not_end_a_deploy(clean_ct: Project) -> None:
    """Progress goes to stderr: its reader leaving (`2>&1 | head -1` in a script) drops the
    lines, the deploy goes on to its end and exits 0."""
    project = clean_ct
    book = project.playbook("edges", workdir=EDGE_WORKDIR, gpus=0, stop_grace=3)
    project.write({"edges": (VMID, book)})
    assert project.launcher("deploy", "--restart").returncode == 0
    before = pane_pid(project, "edges")
    child = subprocess.Popen(
        project.argv("deploy", "--restart"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stderr is not None and child.stdout is not None
    child.stderr.read(1)
    child.stderr.close()  # the reader goes away after the first byte
    out = child.stdout.read().decode()
    assert child.wait(timeout=120) == 0, out
    assert "deployed edges" in out
    assert pane_pid(project, "edges") != before  # the new run is the one running


def test_a_symlink_loop_in_a_project_is_a_usage_error_naming_it(clean_ct: Project) -> None:
    project = clean_ct
    src = project.root / "looped"
    src.mkdir(parents=True)
    (src / "main.py").write_text(CHECKPOINTER)
    (src / "data").mkdir()
    os.symlink("b.txt", src / "data" / "a.txt")
    os.symlink("a.txt", src / "data" / "b.txt")
    book = project.playbook("looped", workdir=EDGE_WORKDIR, gpus=0)
    del book["script"]
    book["project"] = {"source": str(src)}
    book["command"] = "python3 main.py"
    project.write({"looped": (VMID, book)})
    deployed = project.launcher("deploy", "--restart")
    assert deployed.returncode == 2, deployed.stderr
    assert "'data/a.txt' cannot be read: " in deployed.stderr
    assert "Traceback" not in deployed.stderr


def test_a_reader_of_stdout_gone_before_the_result_keeps_the_deploys_exit_code(
    clean_ct: Project,
) -> None:
    """`launcher deploy --restart --json | true`: the deploy is done when its result is
    printed; the reader's leaving loses the document, not the exit code (0, not 141)."""
    project = clean_ct
    book = project.playbook("edges", workdir=EDGE_WORKDIR, gpus=0, stop_grace=3)
    project.write({"edges": (VMID, book)})
    for args in (("deploy", "--restart", "--json"), ("deploy", "--restart")):
        child = subprocess.Popen(
            project.argv(*args),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert child.stdout is not None
        child.stdout.close()  # the reader is gone before anything is printed
        _, err = child.communicate(timeout=120)
        assert child.returncode == 0, err.decode()
        assert b"Traceback" not in err
        assert pane_pid(project, "edges")
