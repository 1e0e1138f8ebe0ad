"""`launcher deploy` end to end: real sshd, LXC, tmux and the pct stand-in."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time

import pytest

from launcher.agent.protocol import LOCK_PATH
from launcher.deploy.deploy import INLINE_LIMIT
from tests.e2e.project import (
    DEMO_TRAINER,
    Project,
    host_tmp_files,
    json_out,
    new_host_tmp_files,
    tree,
)

pytestmark = pytest.mark.e2e

VMID = 200
TRAINER_SHA = hashlib.sha256(DEMO_TRAINER.read_bytes()).hexdigest()


def deploy_ok(project: Project, *args: str) -> str:
    result = project.launcher("deploy", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stderr + result.stdout  # the steps (progress, stderr), then the summary


def test_fresh_deploy_then_restart(project: Project) -> None:
    tmp_before = host_tmp_files()
    book = project.playbook("fresh")
    project.write({"fresh": (VMID, book)})
    calls_before = project.sandbox.pct_calls()
    out = deploy_ok(project)
    assert project.sandbox.pct_calls() - calls_before == 1, "one transaction, script inline"
    assert "deployed fresh" in out
    project.wait_for(
        lambda: project.ct(VMID, "test", "-d", "/root/fresh/checkpoints").returncode == 0,
        what="the first checkpoint folder",
    )

    # A second deploy without --restart refuses and changes nothing.
    before = tree(project, VMID, "/root/fresh")
    refused = project.launcher("deploy")
    assert refused.returncode == 4
    assert "session 'fresh' is running; use --restart" in refused.stderr
    assert [
        p for p in tree(project, VMID, "/root/fresh") if "checkpoints" not in p and ".log" not in p
    ] == [p for p in before if "checkpoints" not in p and ".log" not in p]

    calls_before = project.sandbox.pct_calls()
    out = deploy_ok(project, "--restart")
    assert project.sandbox.pct_calls() - calls_before == 1, "one transaction, script inline"
    assert "archived-" in out
    project.wait_for(lambda: project.processes(VMID, "train_demo.py"), what="the new trainer")
    time.sleep(0.5)
    trainers = project.processes(VMID, "train_demo.py")
    assert len(trainers) == 1, trainers
    archives = project.ct_text(VMID, "sh", "-c", "ls -d /root/fresh/checkpoints.archived-*").split()
    assert len(archives) == 1
    sha = project.ct_text(VMID, "sha256sum", "/root/fresh/train_demo.py").split()[0]
    assert sha == TRAINER_SHA
    record = project.ct_text(VMID, "cat", "/root/fresh/.launcher/current.json")
    assert TRAINER_SHA in record
    assert new_host_tmp_files(tmp_before) == [], "upload temp files left on the host"
    project.kill_session(VMID, "fresh")


def test_restart_kills_leftover_children_and_frees_gpus(project: Project) -> None:
    book = project.playbook(
        "orphans", env={"DEMO_SPAWN_CHILD": "1", "DEMO_IGNORE_SIGINT": "1"}, stop_grace=1
    )
    project.write({"orphans": (VMID, book)})
    deploy_ok(project)
    project.wait_for(
        lambda: len(project.processes(VMID, "train_demo.py")) >= 2, what="the child worker"
    )
    result = project.launcher("deploy", "--restart", "--json")
    assert result.returncode == 0, result.stderr
    report = json_out(result)
    stopped = report["result"]["stopped"]
    assert stopped["was_running"] is True
    assert stopped["forced"] is True
    assert stopped["leftover"] == []
    # Exactly the new run's processes hold GPUs now: the trainer and its child worker.
    project.wait_for(lambda: len(project.processes(VMID, "train_demo.py")) == 2, what="new run")
    project.kill_session(VMID, "orphans")
    project.ct(VMID, "pkill", "-KILL", "-f", "train_demo.py")


def test_corrupted_push_leaves_old_run_alone(project: Project) -> None:
    tmp_before = host_tmp_files()
    book = project.playbook("corrupt")
    project.write({"corrupt": (VMID, book)})
    deploy_ok(project)
    old_sha = project.ct_text(VMID, "sha256sum", "/root/corrupt/train_demo.py").split()[0]
    # A new version over the inline limit, so it travels by `pct push` (the partial-write fault).
    changed = project.root / "train_v2.py"
    padding = b"# " + b"x" * 998 + b"\n"
    changed.write_bytes(DEMO_TRAINER.read_bytes() + padding * (INLINE_LIMIT // len(padding) + 1))
    book["script"]["source"] = str(changed)
    project.write({"corrupt": (VMID, book)})
    project.sandbox.set_faults(partial_push=True)
    result = project.launcher("deploy", "--restart")
    project.sandbox.set_faults()
    assert result.returncode == 3, result.stdout + result.stderr
    assert "transfer corrupted" in result.stderr
    assert project.processes(VMID, "train_demo.py"), "the old run must still be alive"
    assert project.ct_text(VMID, "sha256sum", "/root/corrupt/train_demo.py").split()[0] == old_sha
    leftovers = project.ct_text(VMID, "sh", "-c", "ls -a /root/corrupt | grep launcher- || true")
    assert leftovers.strip() == ""
    assert new_host_tmp_files(tmp_before) == [], "upload temp files left on the host"
    project.kill_session(VMID, "corrupt")


def test_large_script_first_deploy_by_push(project: Project) -> None:
    big = project.root / "train_big.py"
    padding = b"# " + b"y" * 998 + b"\n"
    big.write_bytes(DEMO_TRAINER.read_bytes() + padding * (INLINE_LIMIT // len(padding) + 1))
    book = project.playbook("bigpush")
    book["script"]["source"] = str(big)
    project.write({"bigpush": (VMID, book)})
    calls = project.sandbox.pct_calls()
    out = deploy_ok(project)
    # preflight (creates the workdir), push, its size and sha256 checked, transaction
    assert project.sandbox.pct_calls() - calls == 4
    assert "pushed to" in out
    sha = project.ct_text(VMID, "sha256sum", "/root/bigpush/train_demo.py").split()[0]
    assert sha == hashlib.sha256(big.read_bytes()).hexdigest()
    project.kill_session(VMID, "bigpush")


def wait_for_lock_held_by(project: Project, pid: int) -> None:
    """Until the container's deploy lock names client `pid` (written once it took the lock)."""

    def held() -> bool:
        lock = project.ct(VMID, "cat", LOCK_PATH).stdout
        return f'"client_pid": {pid}'.encode() in lock

    project.wait_for(held, timeout=60, what=f"the lock held by the deploy of pid {pid}")


def test_two_deploys_at_once_one_is_refused(project: Project) -> None:
    tmp_before = host_tmp_files()
    book = project.playbook("race", env={"DEMO_IGNORE_SIGINT": "1"}, stop_grace=4)
    project.write({"race": (VMID, book)})
    deploy_ok(project)
    cmd = project.argv("deploy", "--restart")
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # The first one holds the lock, then stops the old run (which ignores SIGINT: 4 s).
    wait_for_lock_held_by(project, first.pid)
    second = project.launcher("deploy", "--restart")
    _, first_err = first.communicate(timeout=60)
    assert first.returncode == 0, first_err
    assert second.returncode == 4, second.stderr
    assert "another deploy is running" in second.stderr
    assert new_host_tmp_files(tmp_before) == [], "upload temp files left on the host"
    project.kill_session(VMID, "race")


def test_wait_lock_queues_behind_a_deploy_in_progress(project: Project) -> None:
    """--wait-lock: the second deploy waits for the first's lock (saying who holds it) and then
    deploys; a wait too short still refuses with exit 4, naming how long it waited."""
    book = project.playbook("queue", env={"DEMO_IGNORE_SIGINT": "1"}, stop_grace=6)
    project.write({"queue": (VMID, book)})
    deploy_ok(project)
    cmd = project.argv("deploy", "--restart")
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Once it holds the lock it stops the old run, which ignores SIGINT: 6 s of stop grace.
    wait_for_lock_held_by(project, first.pid)
    waiting = [*cmd, "--wait-lock", "1m"]
    second = subprocess.Popen(waiting, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    short = project.launcher("deploy", "--restart", "--wait-lock", "1s")
    _, first_err = first.communicate(timeout=60)
    _, second_err = second.communicate(timeout=90)
    assert first.returncode == 0, first_err
    assert short.returncode == 4, short.stderr
    assert "another deploy is running (waited 1s)" in short.stderr
    assert second.returncode == 0, second_err
    assert "waiting for the lock" in second_err and "held by" in second_err
    records = json_out(project.launcher("history", "--json"))["records"]
    assert len(records) >= 3  # the first deploy, the one that waited, and the one before
    project.kill_session(VMID, "queue")


def test_lock_left_by_killed_deployer_is_broken(project: Project) -> None:
    book = project.playbook("stale", env={"DEMO_IGNORE_SIGINT": "1"}, stop_grace=5)
    project.write({"stale": (VMID, book)})
    deploy_ok(project)
    cmd = project.argv("deploy", "--restart")
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # Its transaction holds the lock (then stops the old run, which ignores SIGINT: 5 s).
    wait_for_lock_held_by(project, first.pid)
    # Kill the deployer and its transaction in the container (as a crash or OOM kill would).
    first.send_signal(signal.SIGKILL)
    first.wait()
    project.ct(VMID, "pkill", "-KILL", "-f", "launcher_agent")
    result = project.launcher("deploy", "--restart")
    assert result.returncode == 0, result.stderr
    assert "broke stale lock" in result.stderr  # a step: progress, on stderr
    project.kill_session(VMID, "stale")


def test_unsafe_checkpoint_symlink_touches_nothing(project: Project) -> None:
    book = project.playbook("unsafe")
    project.write({"unsafe": (VMID, book)})
    project.ct(VMID, "mkdir", "-p", "/root/unsafe", "/root/outside")
    project.ct(VMID, "touch", "/root/outside/precious.pt")
    project.ct(VMID, "ln", "-sfn", "/root/outside", "/root/unsafe/checkpoints")
    result = project.launcher("deploy", "--restart")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "checkpoints" in result.stderr
    assert project.ct(VMID, "test", "-f", "/root/outside/precious.pt").returncode == 0
    assert project.ct(VMID, "test", "-L", "/root/unsafe/checkpoints").returncode == 0
    assert project.ct(VMID, "test", "-e", "/root/unsafe/train_demo.py").returncode != 0


def test_hostile_paths_and_env_round_trip(project: Project) -> None:
    hostile = 'it\'s $(touch /tmp/pwned); `id` "q"'
    book = project.playbook(
        "hostile",
        workdir="/root/odd dir; $(touch /tmp/pwned)",
        checkpoints="ckpt 'x'",
        env={"HOSTILE": hostile, "MULTI": "a\nb"},
        command='printf "%s|%s" "$HOSTILE" "$MULTI" > env.out; python3 train_demo.py',
    )
    book["script"]["dest"] = "we ird;`x`.py"
    book["command"] = book["command"].replace("train_demo.py", "'we ird;`x`.py'")
    project.write({"hostile": (VMID, book)})
    deploy_ok(project)
    workdir = "/root/odd dir; $(touch /tmp/pwned)"
    project.wait_for(
        lambda: project.ct(VMID, "test", "-s", f"{workdir}/env.out").returncode == 0, what="env.out"
    )
    assert project.ct_text(VMID, "cat", f"{workdir}/env.out") == f"{hostile}|a\nb"
    assert project.ct(VMID, "test", "-f", f"{workdir}/we ird;`x`.py").returncode == 0
    assert project.ct(VMID, "test", "-e", "/tmp/pwned").returncode != 0
    assert not os.path.exists("/tmp/pwned")
    project.kill_session(VMID, "hostile")


def test_hostile_session_name_is_refused(project: Project) -> None:
    project.write({"bad": (VMID, project.playbook("bad", session="x; rm -rf /"))})
    result = project.launcher("deploy")
    assert result.returncode == 2
    assert "is not a usable tmux session name" in result.stderr


def test_dry_run_changes_nothing(project: Project) -> None:
    book = project.playbook("dry")
    project.write({"dry": (VMID, book)})
    deploy_ok(project)
    project.wait_for(
        lambda: project.ct(VMID, "test", "-d", "/root/dry/checkpoints").returncode == 0,
        what="checkpoints",
    )
    processes = project.processes(VMID, "train_demo.py")
    files = [
        p for p in tree(project, VMID, "/root/dry") if "/checkpoints/" not in p and ".log" not in p
    ]
    calls = project.sandbox.pct_calls()
    result = project.launcher("deploy", "--restart", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "stop" in result.stderr and "archived-<UTC time>" in result.stderr
    assert "nothing was changed" in result.stdout
    assert project.sandbox.pct_calls() - calls == 1
    assert project.processes(VMID, "train_demo.py") == processes
    after = [
        p for p in tree(project, VMID, "/root/dry") if "/checkpoints/" not in p and ".log" not in p
    ]
    assert after == files
    project.kill_session(VMID, "dry")


def test_dry_run_on_a_fresh_container_lists_the_checks_the_deploy_runs(project: Project) -> None:
    """The plan is the transaction's own checks: a first deploy plans cleanly, creates nothing,
    and then runs exactly the checks the plan showed."""
    book = project.playbook("freshplan", workdir="/root/never/deployed/here")
    project.write({"freshplan": (VMID, book)})
    planned = project.launcher("deploy", "--dry-run", "--json")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    plan_steps = json_out(planned)["steps"]
    assert project.ct(VMID, "test", "-e", "/root/never").returncode != 0, "a plan creates nothing"
    checks = [s["name"] for s in plan_steps if s["status"] != "planned"]
    assert [s["name"] for s in plan_steps if s["status"] == "planned"] == [
        "install", "stop", "checkpoints", "launch", "record",
    ]  # fmt: skip
    deployed = project.launcher("deploy", "--json")
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    ran = [s["name"] for s in json_out(deployed)["steps"] if s["name"] in checks]
    assert ran == checks
    project.kill_session(VMID, "freshplan")
    project.ct(VMID, "rm", "-rf", "/root/never")


def test_unknown_host_key_exit_3_and_nothing_ran(project: Project) -> None:
    empty = project.root / "empty_known_hosts"
    empty.write_text("")
    project.write({"hk": (VMID, project.playbook("hk"))}, host=project.host(known_hosts=str(empty)))
    calls = project.sandbox.pct_calls()
    result = project.launcher("deploy")
    assert result.returncode == 3
    assert "is not in" in result.stderr and "ssh-keyscan" in result.stderr
    assert project.sandbox.pct_calls() == calls


def test_wrong_port_fails_within_bounds(project: Project) -> None:
    project.write(
        {"port": (VMID, project.playbook("port"))}, host=project.host(port=1, connect_timeout=2)
    )
    started = time.monotonic()
    result = project.launcher("deploy")
    elapsed = time.monotonic() - started
    assert result.returncode == 3
    assert "cannot connect" in result.stderr
    assert elapsed < 2 * 3 + 5


def test_stopped_container_exit_3(project: Project) -> None:
    project.write({"stopped": (201, project.playbook("stopped"))})
    project.sandbox.stop_container(201)
    try:
        result = project.launcher("deploy")
    finally:
        project.sandbox.start_container(201)
    assert result.returncode == 3
    assert "container 201 not running" in result.stderr


def test_deploy_streams_its_steps_while_the_stop_waits(project: Project) -> None:
    """Each step is shown as it finishes in the container, the grace period counts down, and a
    forced stop is a warning, not a tick."""
    book = project.playbook("live", env={"DEMO_IGNORE_SIGINT": "1"}, stop_grace=3)
    project.write({"live": (VMID, book)})
    deploy_ok(project)
    proc = subprocess.Popen(
        project.argv("deploy", "--restart"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    seen: list[tuple[float, str]] = []
    for line in proc.stdout:
        seen.append((time.monotonic(), line.rstrip("\n")))
    assert proc.wait(timeout=60) == 0, seen
    at = {text.split()[1]: when for when, text in seen if len(text.split()) > 1}
    countdown = [when for when, text in seen if text.startswith("… stop")]
    forced = next(text for _, text in seen if "forced" in text)
    assert forced.startswith("! stop"), forced
    assert countdown, seen
    # The checks arrived while the old run was still being waited for, seconds before the end.
    assert at["compile"] < countdown[0] <= at["checkpoints"] - 1.5, seen
    project.kill_session(VMID, "live")
