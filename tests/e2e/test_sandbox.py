"""The sandbox itself: sshd, pct stand-in, containers, nvidia-smi stand-in, demo trainer."""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from launcher.sandbox import Sandbox, SandboxInfo
from tests.e2e.conftest import (
    SANDBOX_GPUS,
    SANDBOX_VMIDS,
    SshRunner,
    missing_requirements,
    ssh_argv,
)

pytestmark = pytest.mark.e2e

Box = tuple[Sandbox, SandboxInfo]
DEMO_TRAINER = Path(__file__).resolve().parents[2] / "launcher" / "sandbox" / "demo_trainer.py"
STATUS_LINE = re.compile(
    r"^\[\d+m\] step=\d+ loss=\S+ acc=\S+ streak=\S+ lr=\S+ noise=[\d.]+ \| "
    r"tgt=[\d.]+b/s dft=[\d.]+b/s \([\d.]+Ktok/s\) \| "
    r"q_pre=\[\d+, \d+, \d+, \d+, \d+, \d+\] q_hs=\[\d+\] \| epoch~[\d.]+ ETA=\S+$"
)


def wait_for(predicate: object, timeout: float = 10.0, interval: float = 0.1) -> bool:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def test_up_writes_inventory_and_known_hosts(sandbox: Box) -> None:
    sb, info = sandbox
    assert info.address == "127.0.0.1" and info.user == "root"
    assert info.vmids == SANDBOX_VMIDS
    assert info.state_dir == sb.state_dir
    inventory = info.inventory_path.read_text()
    assert f"port: {info.port}" in inventory
    assert "host_key_policy: strict" in inventory
    for name in ("sandbox:", "default_target: sandbox", *(f"sandbox-{v}:" for v in SANDBOX_VMIDS)):
        assert name in inventory
    playbook = (info.state_dir / "playbooks" / "demo.yaml").read_text()
    assert f"source: {DEMO_TRAINER}" in playbook
    assert f"gpus: {SANDBOX_GPUS}" in playbook
    (line,) = info.known_hosts.read_text().splitlines()
    assert re.fullmatch(rf"\[127\.0\.0\.1\]:{info.port} ssh-ed25519 \S+", line)
    status = sb.status()
    assert status.sshd_alive and status.port == info.port
    assert status.containers == dict.fromkeys(SANDBOX_VMIDS, "running")


def test_pct_exec_over_ssh_returns_output_and_exit_code(ssh: SshRunner) -> None:
    result = ssh("pct", "exec", 200, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert result.returncode == 7
    assert result.stdout == b"out\n"
    assert result.stderr == b"err\n"
    path = ssh("pct", "exec", 200, "--", "sh", "-c", 'echo "$PATH"; hostname')
    assert path.stdout.decode().splitlines() == ["/sbin:/bin:/usr/sbin:/usr/bin", "sandbox-200"]


# A local port on the container's own name, as torchrun's c10d rendezvous opens one.
LOCAL_PORT = (
    "import socket; a = socket.gethostbyname(socket.gethostname()); s = socket.socket(); "
    "s.bind((a, 0)); s.listen(); socket.create_connection(s.getsockname()).close(); print(a)"
)


def test_container_network_is_what_proxmox_sets_up(ssh: SshRunner) -> None:
    """Loopback up (LXC leaves it down in an empty network namespace; ctinit brings it up at
    each start) and the hostname in /etc/hosts."""
    flags = "print(int(open('/sys/class/net/lo/flags').read(), 16) & 1)"  # IFF_UP
    for vmid in SANDBOX_VMIDS:
        result = ssh("pct", "exec", vmid, "--", "python3", "-c", f"{flags}; {LOCAL_PORT}")
        assert result.returncode == 0, result.stderr.decode()
        assert result.stdout == b"1\n127.0.1.1\n", vmid


def test_hostile_argv_round_trips_unchanged(ssh: SshRunner) -> None:
    args = [
        "two words",
        "it's",
        '"double"',
        "$(touch /tmp/pwned)",
        "`touch /tmp/pwned`",
        "a; touch /tmp/pwned",
        "line one\nline two",
        "",
        "*",
        "~root",
        "back\\slash",
        "--",
        "-n",
        "tab\there",
        "$HOME",
        "ünïcödé",
    ]
    result = ssh("pct", "exec", 200, "--", "printf", "%s\\0", *args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().split("\0")[:-1] == args
    assert ssh("pct", "exec", 200, "--", "test", "-e", "/tmp/pwned").returncode == 1
    assert not Path("/tmp/pwned").exists()


def test_push_lands_in_container_not_on_host(sandbox: Box, ssh: SshRunner, tmp_path: Path) -> None:
    sb, _ = sandbox
    src = tmp_path / "payload.bin"
    data = os.urandom(3000)
    src.write_bytes(data)
    dest = f"/root/pushed-{uuid.uuid4().hex}.bin"
    result = ssh("pct", "push", 200, src, dest, "--perms", "0600")
    assert result.returncode == 0, result.stderr
    assert sb.ct_exec(200, ["cat", dest]).stdout == data
    assert sb.ct_exec(200, ["stat", "-c", "%a %U", dest]).stdout == b"600 root\n"
    assert not Path(dest).exists()
    assert (sb.container_root(200) / dest.lstrip("/")).read_bytes() == data

    # a symlink inside the container resolves inside the container
    link = f"/tmp/link-{uuid.uuid4().hex}"
    target = f"/tmp/target-{uuid.uuid4().hex}"
    sb.ct_exec(200, ["ln", "-s", target, link])
    assert ssh("pct", "push", 200, src, link).returncode == 0
    assert not Path(target).exists()
    assert sb.ct_exec(200, ["cat", target]).stdout == data

    # As a real node's: the write runs as a task, whose error reaches stderr only; pct exits 0.
    missing_dir = ssh("pct", "push", 200, src, "/no/such/dir/file")
    assert missing_dir.returncode == 0
    error = b"failed to create file: /no/such/dir/file: No such file or directory\n"
    assert missing_dir.stderr == error

    pulled = tmp_path / "pulled.bin"
    assert ssh("pct", "pull", 200, dest, pulled).returncode == 0
    assert pulled.read_bytes() == data


def test_partial_push_fault_writes_half_and_exits_zero(
    sandbox: Box, ssh: SshRunner, tmp_path: Path
) -> None:
    sb, _ = sandbox
    src = tmp_path / "payload.bin"
    src.write_bytes(b"x" * 1000)
    sb.set_faults(partial_push=True)
    try:
        result = ssh("pct", "push", 200, src, "/root/partial.bin")
    finally:
        sb.set_faults()
    assert result.returncode == 0
    assert sb.ct_exec(200, ["wc", "-c", "/root/partial.bin"]).stdout.split()[0] == b"500"


def test_pct_latency_fault_and_call_log(sandbox: Box, ssh: SshRunner) -> None:
    sb, _ = sandbox
    before = sb.pct_calls()
    sb.set_faults(pct_latency=0.5)
    try:
        started = time.monotonic()
        assert ssh("pct", "status", 200).returncode == 0
        slow = time.monotonic() - started
    finally:
        sb.set_faults()
    assert slow >= 0.5
    assert sb.pct_calls() == before + 1


def test_stopped_container(sandbox: Box, ssh: SshRunner) -> None:
    sb, _ = sandbox
    sb.stop_container(201)
    try:
        assert ssh("pct", "status", 201).stdout == b"status: stopped\n"
        result = ssh("pct", "exec", 201, "--", "true")
        assert result.returncode == 255
        assert result.stderr == b"container '201' not running!\n"
        pushed = ssh("pct", "push", 201, "/etc/hostname", "/root/x")
        assert (pushed.returncode, pushed.stderr) == (255, b"can only push files to a running CT\n")
    finally:
        sb.start_container(201)
    assert ssh("pct", "status", 201).stdout == b"status: running\n"
    assert ssh("pct", "exec", 201, "--", "true").returncode == 0


def test_pct_list_and_errors(ssh: SshRunner) -> None:
    listing = ssh("pct", "list").stdout.decode().splitlines()
    assert listing == [
        "VMID       Status     Lock         Name                ",
        *(f"{v}        running                 sandbox-{v}         " for v in SANDBOX_VMIDS),
    ]
    unknown_option = ssh("pct", "exec", 200, "ls", "-la")
    assert unknown_option.returncode == 255
    assert unknown_option.stderr.startswith(b"Unknown option: la\n")
    unknown_ct = ssh("pct", "exec", 999, "--", "true")
    assert unknown_ct.returncode == 255
    assert b"Configuration file 'nodes/sandbox/lxc/999.conf' does not exist" in unknown_ct.stderr
    assert ssh("pct", "status", 999).returncode == 255


def test_nvidia_smi_and_demo_trainer(sandbox: Box, ssh: SshRunner) -> None:
    sb, _ = sandbox
    gpus = ssh("pct", "exec", 200, "--", "nvidia-smi", "-L").stdout.decode().splitlines()
    assert len(gpus) == SANDBOX_GPUS
    for i, line in enumerate(gpus):
        assert re.fullmatch(
            rf"GPU {i}: NVIDIA RTX PRO 6000 Blackwell \(UUID: GPU-[0-9a-f-]{{36}}\)", line
        )
    assert ssh("pct", "exec", 200, "--", "nvidia-smi", "-L").stdout.decode().splitlines() == gpus

    apps_query = [
        "nvidia-smi",
        "--query-compute-apps=pid,process_name,used_memory",
        "--format=csv,noheader,nounits",
    ]
    assert ssh("pct", "exec", 200, "--", *apps_query).stdout == b""

    # the demo trainer, for real, in tmux inside the container
    sb.ct_exec(200, ["mkdir", "-p", "/root/demo"])
    assert ssh("pct", "push", 200, DEMO_TRAINER, "/root/demo/train_demo.py").returncode == 0
    tmux = ["tmux", "-L", "e2e"]
    launch = [
        *tmux,
        "new-session", "-d", "-s", "demo", "-x", "250", "-y", "50", "-c", "/root/demo",
        "DEMO_INTERVAL=0.2 DEMO_RAMP=1 DEMO_GPUS=2 DEMO_CHECKPOINT_EVERY=2 python3 train_demo.py;"
        " echo exit=$?; sleep 60",
    ]  # fmt: skip
    assert sb.ct_exec(200, launch).returncode == 0
    try:

        def pane() -> list[str]:
            out = sb.ct_exec(200, [*tmux, "capture-pane", "-p", "-J", "-t", "demo"]).stdout
            return out.decode().splitlines()

        assert wait_for(lambda: sum(bool(STATUS_LINE.match(x)) for x in pane()) >= 5), pane()
        lines = pane()
        assert lines[:2] == ["Starting pipeline...", "Pipeline running. Monitoring..."]
        status_lines = [x for x in lines if STATUS_LINE.match(x)]
        assert "loss=--- acc=--- streak=--- lr=---" in status_lines[0]
        assert "loss=---" not in status_lines[-1]

        # As inside a real container: the trainer's HOST pid, its name not found in here.
        apps = ssh("pct", "exec", 200, "--", *apps_query).stdout.decode().splitlines()
        pids = {line.split(", ")[0] for line in apps}
        assert len(apps) == 2 and len(pids) == 1, apps
        assert apps[0].endswith(", [Not Found], 22512"), apps
        trainer = sb.ct_exec(200, ["pgrep", "-f", "train_demo.py"]).stdout.decode().split()
        assert pids.isdisjoint(trainer), (pids, trainer)
        sb.set_gpu_pid_mode(200, "bare-metal")
        try:
            bare = ssh("pct", "exec", 200, "--", *apps_query).stdout.decode().splitlines()
        finally:
            sb.set_gpu_pid_mode(200, "host")
        assert {line.split(", ")[0] for line in bare} <= set(trainer) and "python3" in bare[0]
        # Its device files, as fuser sees them.
        fds = sb.ct_exec(200, ["sh", "-c", "ls -l /proc/[0-9]*/fd/ 2>/dev/null"]).stdout.decode()
        assert "-> /dev/nvidia0" in fds and "-> /dev/nvidia1" in fds and "/dev/nvidia2" not in fds
        used = ssh(
            "pct", "exec", 200, "--", "nvidia-smi", "--query-gpu=index,memory.used",
            "--format=csv,noheader,nounits",
        ).stdout.decode().splitlines()  # fmt: skip
        assert used[:3] == ["0, 22512", "1, 22512", "2, 0"]
        assert sb.ct_exec(200, ["ls", "/root/demo/checkpoints"]).stdout.startswith(b"step_")

        # C-c: the trainer saves and exits 130. (The exit status is echoed by the pane's shell
        # because tmux 3.3a now and then misses the SIGCHLD and leaves #{pane_dead_status} empty.)
        sb.ct_exec(200, [*tmux, "send-keys", "-t", "demo", "C-c"])
        assert wait_for(lambda: "exit=130" in pane()), pane()
        assert any(x.endswith("Interrupted; saving checkpoint...") for x in pane())
        # The driver frees an exited process's memory a moment later.
        assert wait_for(lambda: ssh("pct", "exec", 200, "--", *apps_query).stdout == b"")
    finally:
        sb.ct_exec(200, [*tmux, "kill-server"])

    count_file = sb.container_root(201) / "etc" / "sandbox-gpus"
    count_file.write_text("0\n")
    try:
        no_driver = ssh("pct", "exec", 201, "--", "nvidia-smi", "-L")
    finally:
        count_file.write_text(f"{SANDBOX_GPUS}\n")
    assert no_driver.returncode == 9
    assert no_driver.stdout.startswith(
        b"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    )


def _init_start_time(sb: Sandbox, vmid: int) -> str:
    stat = sb.ct_exec(vmid, ["cat", "/proc/1/stat"]).stdout.decode()
    return stat.rsplit(")", 1)[1].split()[19]


def test_up_twice_is_idempotent(sandbox: Box, ssh: SshRunner) -> None:
    sb, info = sandbox
    before = sb.status()
    starts = {vmid: _init_start_time(sb, vmid) for vmid in info.vmids}
    again = sb.up(info.vmids, gpus=SANDBOX_GPUS)
    assert again == info
    after = sb.status()
    assert after.sshd_pid == before.sshd_pid
    assert {vmid: _init_start_time(sb, vmid) for vmid in info.vmids} == starts
    assert ssh("pct", "status", 200).stdout == b"status: running\n"


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{pid}: {cmdline}")
    return found


def test_recovers_from_a_killed_run_and_down_leaves_nothing(tmp_path: Path) -> None:
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    state_dir = tmp_path / "second sandbox"  # a space in the path, on purpose
    sb = Sandbox(state_dir)
    try:
        info = sb.up([300])
        # a killed run: sshd gone with its pid file left behind, a container stopped
        sshd_pid = sb.status().sshd_pid
        assert sshd_pid is not None
        os.kill(sshd_pid, 9)
        assert wait_for(lambda: not sb.status().sshd_alive)
        sb.stop_container(300)
        info = sb.up([300, 301])
        status = sb.status()
        assert status.sshd_alive and status.sshd_pid != sshd_pid
        assert status.containers == {300: "running", 301: "running"}
        result = subprocess.run(
            ssh_argv(info, "pct exec 301 -- hostname"), capture_output=True, timeout=30, check=False
        )
        assert result.stdout == b"sandbox-301\n", result.stderr
    finally:
        sb.down()
    assert not state_dir.exists()
    assert _processes_mentioning(str(state_dir)) == []
    states = subprocess.run(
        ["lxc-info", "-n", "300", "-P", str(state_dir / "lxc"), "-s"],
        capture_output=True,
        check=False,
    )
    assert b"RUNNING" not in states.stdout
    assert not sb.status().exists
    sb.down()  # a second down is a no-op
