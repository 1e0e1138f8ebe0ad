"""Hostile deploys on the sandbox: paths that escape the workdir, secrets, launches that cannot
start, GPUs held from outside the run, leftovers of killed deploys, scripts that do not compile.

Each case is one a user or a broken trainer produced; none may lose data or stop a healthy run
before every check that could refuse the deploy has passed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.project import Project, json_out

pytestmark = pytest.mark.e2e

VMID = 202
GPU_DEVICE = "/dev/nvidia0"
UVM_DEVICE = "/dev/nvidia-uvm"

# A trainer whose data-loader helper escaped the run: a double fork into a new session with a
# cleared environment (`setsid env -i`), using a GPU as CUDA does (/dev/nvidia-uvm and the GPU's
# device file open). Nothing ties it to the run any more.
ESCAPING_TRAINER = f"""
import subprocess, time
CHILD = "import sys,time;f=[open(p) for p in sys.argv[2:]];time.sleep(600)"
subprocess.Popen(
    # setsid(1) forks when its caller already leads a process group, as here: the holder is
    # reparented away from the run's tree, and for a moment setsid's own pid matches too.
    ["setsid", "env", "-i", "/usr/bin/python3", "-c", CHILD, "escaped-gpu-holder",
     {GPU_DEVICE!r}, {UVM_DEVICE!r}],
    start_new_session=True,
    stdin=subprocess.DEVNULL,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
)
print("step=1 loss=1.0", flush=True)
time.sleep(600)
"""
HOLDER_WAIT = 60.0  # s: a bound for the holder to appear on a loaded machine, not a pause


def ct_ok(project: Project, *argv: str) -> str:
    result = project.ct(VMID, *argv)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


def gpu_holder(project: Project, pattern: str) -> str | None:
    """The one process matching pattern once it uses the GPU (its device file and
    /dev/nvidia-uvm open), else None."""
    found = ct_ok(
        project,
        "sh",
        "-c",
        'for p in $(pgrep -f "$1"); do fds=$(ls -l /proc/$p/fd 2>/dev/null); '
        'case "$fds" in *"$2"*) case "$fds" in *"$3"*) echo $p;; esac;; esac; done; true',
        "sh",
        pattern,
        GPU_DEVICE,
        UVM_DEVICE,
    ).split()
    return found[0] if len(found) == 1 else None


def pane_pid(project: Project, session: str) -> str:
    return ct_ok(project, "tmux", "display-message", "-p", "-t", f"={session}:", "#{pane_pid}")


@pytest.fixture
def clean_ct(project: Project) -> Iterator[Project]:
    """Whatever a case leaves in the container (escaped holders, sessions) is gone after it."""
    yield project
    project.ct(VMID, "pkill", "-KILL", "-f", "escaped-gpu-holder")
    project.ct(VMID, "tmux", "kill-server")
    project.ct(VMID, "rm", "-rf", "/victim", "/root/hostile-wd", "/root/link-to-root")


@pytest.mark.parametrize("checkpoints", ["victim", "etc"])
def test_workdir_symlinked_to_root_cannot_purge_outside(
    clean_ct: Project, checkpoints: str
) -> None:
    project = clean_ct
    ct_ok(project, "mkdir", "-p", "/victim")
    ct_ok(project, "sh", "-c", "echo precious > /victim/data")
    ct_ok(project, "ln", "-sfn", "/", "/root/link-to-root")
    book = project.playbook("escape", workdir="/root/link-to-root", checkpoints=checkpoints)
    project.write({"escape": (VMID, book)})
    result = project.launcher("deploy", "--restart", "--purge-checkpoints")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "resolves to /" in result.stderr
    assert ct_ok(project, "cat", "/victim/data") == "precious\n"
    assert ct_ok(project, "test", "-f", "/etc/passwd") == ""
    assert project.ct(VMID, "test", "-e", "/.launcher").returncode != 0, "nothing written to /"


@pytest.mark.parametrize("checkpoints", [".launcher", "."])
def test_checkpoints_that_hold_launcher_state_are_refused(
    clean_ct: Project, checkpoints: str
) -> None:
    project = clean_ct
    book = project.playbook("ownstate", workdir="/root/hostile-wd")
    project.write({"ownstate": (VMID, book)})
    assert project.launcher("deploy").returncode == 0
    pid = pane_pid(project, "ownstate")
    book["checkpoints"] = checkpoints
    project.write({"ownstate": (VMID, book)})
    result = project.launcher("deploy", "--restart", "--purge-checkpoints")
    # "." is refused by the config already; ".launcher" only by the container's real-path guard.
    assert result.returncode == 2, result.stdout + result.stderr
    assert pane_pid(project, "ownstate") == pid, "the healthy run must not be stopped"
    assert "deploys.jsonl" in ct_ok(project, "ls", "/root/hostile-wd/.launcher")


def test_secrets_are_in_no_command_line_and_reach_the_trainer(clean_ct: Project) -> None:
    project = clean_ct
    secret = "wandb-" + "k" * 20_000  # 20 KB: over what tmux takes on its command line
    book = project.playbook("secret", workdir="/root/hostile-wd", env={"WANDB_API_KEY": secret})
    book["script"]["source"] = str(write_script(project, "print_env.py", PRINT_ENV))
    book["script"]["dest"] = "print_env.py"
    book["command"] = "python3 print_env.py"
    project.write({"secret": (VMID, book)})
    assert project.launcher("deploy").returncode == 0
    # A second deploy replaces a live run: everything the launch needs was proven first.
    result = project.launcher("deploy", "--restart")
    assert result.returncode == 0, result.stdout + result.stderr
    project.wait_for(
        lambda: "WANDB_API_KEY 20006" in project.launcher("logs", "--tail", "5").stdout,
        what="the trainer to see its environment",
    )
    cmdlines = ct_ok(project, "sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
    assert "wandb-kkk" not in cmdlines
    start = ct_ok(
        project, "tmux", "display-message", "-p", "-t", "=secret:", "#{pane_start_command}"
    )
    assert "wandb-kkk" not in start
    mode = ct_ok(project, "stat", "-c", "%a", "/root/hostile-wd/.launcher/secret.run")
    assert mode.strip() == "600"
    assert secret not in result.stdout + result.stderr
    assert "wandb-kkk" not in project.launcher("history", "--json").stdout


PRINT_ENV = """
import os, time
print("WANDB_API_KEY", len(os.environ.get("WANDB_API_KEY", "")), flush=True)
time.sleep(600)
"""


def write_script(project: Project, name: str, text: str) -> Path:
    path = project.root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_launch_that_cannot_start_is_refused_before_the_stop(clean_ct: Project) -> None:
    project = clean_ct
    book = project.playbook("toolong", workdir="/root/hostile-wd")
    project.write({"toolong": (VMID, book)})
    assert project.launcher("deploy").returncode == 0
    pid = pane_pid(project, "toolong")
    book["command"] = "python3 train_demo.py " + "--flag " * 30_000  # 210 KB: exec would fail
    project.write({"toolong": (VMID, book)})
    result = project.launcher("deploy", "--restart")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "command is" in result.stderr
    assert pane_pid(project, "toolong") == pid, "the healthy run must not be stopped"
    archived = ct_ok(project, "sh", "-c", "ls /root/hostile-wd | grep -c archived || true")
    assert archived.strip() == "0", "checkpoints must not be moved"


def test_gpus_held_from_outside_the_run_refuse_the_deploy(clean_ct: Project) -> None:
    project = clean_ct
    book = project.playbook("escaper", workdir="/root/hostile-wd", stop_grace=1)
    book["script"]["source"] = str(write_script(project, "escaper.py", ESCAPING_TRAINER))
    book["script"]["dest"] = "escaper.py"
    book["command"] = "python3 escaper.py"
    project.write({"escaper": (VMID, book)})
    assert project.launcher("deploy").returncode == 0
    holder = project.wait_for(
        lambda: gpu_holder(project, "escaped-gpu-holder"),
        timeout=HOLDER_WAIT,
        what="the escaped holder",
    )
    pid = pane_pid(project, "escaper")

    refused = project.launcher("deploy", "--restart")
    assert refused.returncode == 4, refused.stdout + refused.stderr
    assert f"pid {holder}" in refused.stderr and "escaped-gpu-holder" in refused.stderr
    assert "--kill-gpu-holders" in refused.stderr
    assert pane_pid(project, "escaper") == pid, "refused before the old run was stopped"

    # `stop` ends the run but must not call the GPUs free while the escaped child holds one.
    stopped = project.launcher("stop")
    assert stopped.returncode == 3, stopped.stdout + stopped.stderr
    assert not re.search(r"✓ gpus\s+free", stopped.stdout), stopped.stdout
    assert "outside the run" in stopped.stdout

    forced = project.launcher("deploy", "--restart", "--kill-gpu-holders", "--json")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    steps = {s["name"]: s for s in json_out(forced)["steps"]}
    assert steps["gpus"]["status"] == "warning" and holder in steps["gpus"]["detail"]
    project.wait_for(
        lambda: holder not in ct_ok(project, "sh", "-c", "pgrep -f escaped-gpu-holder || true"),
        what="the old holder to be gone",
    )


def test_temp_files_left_by_a_killed_deploy_are_removed(clean_ct: Project) -> None:
    project = clean_ct
    book = project.playbook("leftover", workdir="/root/hostile-wd")
    project.write({"leftover": (VMID, book)})
    assert project.launcher("deploy").returncode == 0
    # What a kill -9 during `pct push` of a large script leaves behind.
    stale = "/root/hostile-wd/.train_demo.py.launcher-00112233aabb.tmp"
    ct_ok(project, "dd", "if=/dev/zero", f"of={stale}", "bs=1M", "count=5", "status=none")
    result = project.launcher("deploy", "--restart")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "stale temp" in result.stderr  # a step: progress, on stderr
    assert project.ct(VMID, "test", "-e", stale).returncode != 0


def test_a_script_that_does_not_compile_is_quoted_from_the_new_version(clean_ct: Project) -> None:
    project = clean_ct
    good = write_script(project, "model.py", "import time\nlr = 0.1\ntime.sleep(600)\n")
    book = project.playbook("syntax", workdir="/root/hostile-wd")
    book["script"] = {"source": str(good), "dest": "model.py"}
    book["command"] = "python3 model.py"
    project.write({"syntax": (VMID, book)})
    assert project.launcher("deploy").returncode == 0
    pid = pane_pid(project, "syntax")
    good.write_text("import time\nlr = (0.1\ntime.sleep(600)\n")
    result = project.launcher("deploy", "--restart")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "lr = (0.1" in result.stderr
    assert "lr = 0.1\n" not in result.stderr
    assert pane_pid(project, "syntax") == pid


def test_an_unreadable_script_is_a_clear_error(clean_ct: Project) -> None:
    project = clean_ct
    # A regular file whose read fails with EIO, as a failing disk or network mount would.
    book = project.playbook("unreadable", workdir="/root/hostile-wd")
    book["script"]["source"] = "/proc/self/mem"
    project.write({"unreadable": (VMID, book)})
    result = project.launcher("deploy")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "cannot be read" in result.stderr and "mem" in result.stderr
