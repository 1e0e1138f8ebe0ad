"""A real Proxmox node, not a tidy one (docs/proxmox.md), against the sandbox: `pct push` that
exits 0 when its write fails, `pct exec` keeping or clearing the caller's environment, a tmux
socket removed under a live run, pct at a real node's cost."""

from __future__ import annotations

import hashlib
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.e2e.conftest import SshRunner
from tests.e2e.project import DEMO_TRAINER, Project
from tests.e2e.test_releases import book as project_book
from tests.e2e.test_releases import make_package

pytestmark = pytest.mark.e2e

VMID = 200
SIX_MIB = 6 * 2**20


def ok(result: subprocess.CompletedProcess[str], code: int = 0) -> str:
    assert result.returncode == code, result.stdout + result.stderr
    return result.stderr + result.stdout


def fresh(name: str) -> str:
    """A name whose workdir does not exist yet in the container: a first deploy."""
    return f"{name}{uuid.uuid4().hex[:6]}"


def big_script(project: Project, name: str) -> Path:
    """The demo trainer padded to 6 MiB: over the inline limit, so it travels by `pct push`."""
    path = project.root / f"{name}.py"
    padding = b"# " + b"z" * 1021 + b"\n"
    body = DEMO_TRAINER.read_bytes()
    path.write_bytes(body + padding * ((SIX_MIB - len(body)) // len(padding) + 1))
    return path


def pids(project: Project, pattern: str, vmid: int = VMID) -> set[str]:
    return set(project.ct_text(vmid, "pgrep", "-f", pattern).split())


# ------------------------------------------------------------------ 1. pct push exits 0


def test_first_deploy_of_a_6mib_script_into_a_fresh_ct(project: Project) -> None:
    name = fresh("big")
    script = big_script(project, name)
    book = project.playbook(name)
    book["script"]["source"] = str(script)
    project.write({name: (VMID, book)})
    assert project.ct(VMID, "test", "-e", f"/root/{name}").returncode == 1, "not fresh"
    out = ok(project.launcher("deploy"))
    assert "size and sha256 checked" in out
    sha = project.ct_text(VMID, "sha256sum", f"/root/{name}/train_demo.py").split()[0]
    assert sha == hashlib.sha256(script.read_bytes()).hexdigest()
    project.wait_for(lambda: project.processes(VMID, "train_demo.py"), what="the trainer")
    project.kill_session(VMID, name)


def test_first_deploy_of_a_project_with_a_6mib_file_into_a_fresh_ct(project: Project) -> None:
    name = fresh("pkg")
    src = make_package(project.root)
    (src / "weights.bin").write_bytes(os.urandom(SIX_MIB))  # random: gzip cannot shrink it
    book = project_book(project, src)
    book.update(name=name, session=name, workdir=f"/root/{name}")
    project.write({name: (VMID, book)})
    assert project.ct(VMID, "test", "-e", f"/root/{name}").returncode == 1, "not fresh"
    out = ok(project.launcher("deploy"))
    assert f"pushed to /root/{name}/.release.launcher-" in out
    size = project.ct_text(VMID, "stat", "-c", "%s", f"/root/{name}/current/weights.bin")
    assert size.strip() == str(SIX_MIB)
    project.kill_session(VMID, name)


def test_a_push_that_fails_and_exits_0_is_reported_and_stops_nothing(project: Project) -> None:
    name = fresh("full")
    book = project.playbook(name)
    project.write({name: (VMID, book)})
    ok(project.launcher("deploy"))
    project.wait_for(lambda: project.processes(VMID, "train_demo.py"), what="the first run")
    before = pids(project, "train_demo.py")
    book["script"]["source"] = str(big_script(project, name))
    project.write({name: (VMID, book)})
    project.sandbox.set_faults(push_error="No space left on device")
    result = project.launcher("deploy", "--restart")
    project.sandbox.set_faults()
    assert result.returncode == 3, result.stdout + result.stderr
    assert "pct push to /root/" in result.stderr
    assert "failed: failed to create file: " in result.stderr
    assert "No space left on device" in result.stderr
    assert before <= pids(project, "train_demo.py"), "the old run must be untouched"
    leftovers = project.ct_text(VMID, "sh", "-c", f"ls -a /root/{name} | grep launcher- || true")
    assert leftovers.strip() == ""
    project.kill_session(VMID, name)


# ------------------------------------------------------------------ 2. the run's environment

ENV_CT = 203
# A root SSH session on a Proxmox node (the sandbox's sshd sets them as PAM would) and sshd's.
NODE_SESSION = ("XDG_RUNTIME_DIR", "XDG_SESSION_ID", "MOTD_SHOWN", "SSH_CONNECTION", "SSH_CLIENT")
# The run's marker, pane and workdir, and what launcher tells each run about itself (its id,
# workdir, checkpoints): the two runs differ in those by design.
PER_RUN = ("LAUNCHER_RUN", "TMUX", "TMUX_PANE", "PWD", "LAUNCHER_RUN_ID", "LAUNCHER_WORKDIR",
           "LAUNCHER_CHECKPOINTS")  # fmt: skip


def env_of(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def run_environment(project: Project, keep_env: bool) -> tuple[dict[str, str], str]:
    """The environment a fresh run gets, and its tmux server's global environment, with
    `pct exec` keeping (today's default) or clearing the node session's environment."""
    project.sandbox.set_faults(keep_env=keep_env)
    project.ct(ENV_CT, "tmux", "kill-server")  # a server started by this deploy
    name = fresh("envrun")
    book = project.playbook(name, command="env > run.env; exec python3 train_demo.py", gpus=0)
    project.write({name: (ENV_CT, book)})
    ok(project.launcher("deploy"))
    project.wait_for(
        lambda: project.ct(ENV_CT, "test", "-s", f"/root/{name}/run.env").returncode == 0,
        what="the run's environment",
    )
    env = env_of(project.ct_text(ENV_CT, "cat", f"/root/{name}/run.env"))
    server = project.ct_text(ENV_CT, "tmux", "show-environment", "-g")
    project.kill_session(ENV_CT, name)
    return env, server


def test_the_runs_environment_is_the_same_under_keep_env_and_clear_env(
    project: Project, ssh: SshRunner
) -> None:
    # The leak is real: under keep-env, what pct exec starts has the node session's variables.
    project.sandbox.set_faults(keep_env=True)
    leaked = env_of(ssh("pct", "exec", ENV_CT, "--", "env").stdout.decode())
    assert leaked["XDG_RUNTIME_DIR"] == "/run/user/0" and leaked["LANG"] == "en_US.UTF-8"
    project.sandbox.set_faults(keep_env=False)
    cleared = env_of(ssh("pct", "exec", ENV_CT, "--", "env").stdout.decode())
    assert "XDG_RUNTIME_DIR" not in cleared and cleared["container"] == "lxc"

    kept_env, kept_server = run_environment(project, keep_env=True)
    clear_env, clear_server = run_environment(project, keep_env=False)
    for var in PER_RUN:
        kept_env.pop(var, None)
        clear_env.pop(var, None)
    assert kept_env == clear_env
    assert not set(NODE_SESSION) & set(kept_env), kept_env
    assert kept_env.get("LANG") != "en_US.UTF-8"  # the container's locale, not the node's
    assert kept_env["HOME"] == "/root" and "/usr/local/bin" in kept_env["PATH"].split(":")
    for key, value in project.playbook("x")["env"].items():  # the playbook's env, as given
        assert kept_env[key] == str(value)
    for server in (kept_server, clear_server):
        assert "SSH_" not in server and "XDG_RUNTIME_DIR" not in server, server
        assert "LANG=en_US.UTF-8" not in server, server


# ------------------------------------------------------------------ 4. tmux's socket removed


def tmux_servers(project: Project, vmid: int) -> list[str]:
    return project.ct_text(vmid, "pgrep", "-x", "tmux: server").split()


def delete_socket_under_a_live_run(project: Project, vmid: int) -> None:
    """Deploy a run, then remove tmux's socket and its directory as systemd-tmpfiles does to
    /tmp files nobody touched for 10 days (tmux/tmux#4640); the server and the run live on."""
    name = fresh("aged")
    project.write({name: (vmid, project.playbook(name, gpus=2))})
    ok(project.launcher("deploy"))
    project.wait_for(lambda: project.processes(vmid, "train_demo.py"), what="the run")
    assert project.ct(vmid, "rm", "-rf", "/tmp/tmux-0").returncode == 0
    assert project.ct(vmid, "tmux", "has-session").returncode == 1  # tmux's own client is lost
    assert len(tmux_servers(project, vmid)) == 1


def check_the_run_is_found_and_never_doubled(project: Project, vmid: int) -> None:
    trainers = pids(project, "train_demo.py", vmid)
    status = project.launcher("status")
    assert status.returncode == 0, status.stdout + status.stderr  # the live run, not ABSENT
    assert project.ct(vmid, "test", "-S", "/tmp/tmux-0/default").returncode == 0
    project.ct(vmid, "rm", "-rf", "/tmp/tmux-0")  # and again, before the deploys
    refused = project.launcher("deploy")
    assert refused.returncode == 4, refused.stdout + refused.stderr
    assert "is running; use --restart" in refused.stderr
    project.ct(vmid, "rm", "-rf", "/tmp/tmux-0")
    ok(project.launcher("deploy", "--restart"))
    project.wait_for(lambda: project.processes(vmid, "train_demo.py"), what="the new run")
    assert len(tmux_servers(project, vmid)) == 1, "the old server is gone, one run left"
    after = pids(project, "train_demo.py", vmid)
    assert after and not after & trainers, "the old run stopped, exactly one new one"


def test_a_run_whose_tmux_socket_was_removed_is_found_and_never_doubled(
    project: Project,
) -> None:
    vmid = 202
    project.ct(vmid, "tmux", "kill-server")
    delete_socket_under_a_live_run(project, vmid)
    check_the_run_is_found_and_never_doubled(project, vmid)
