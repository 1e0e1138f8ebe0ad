"""Multi-node jobs on a sandbox of their own: two containers on one bridge, as two CTs on a
Proxmox network; the real CLI over real sshd, LXC, tmux and the demo trainer."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from launcher import Launcher
from launcher.core.errors import ExitCode
from launcher.sandbox import Sandbox, SandboxInfo
from launcher.sandbox.network import address
from launcher.schemas import shipped
from launcher.watch.state import TargetRecord
from tests.e2e.conftest import missing_requirements, warm_agent_cache
from tests.e2e.hostpython import host_has_torch
from tests.e2e.project import Project
from tests.e2e.test_watch import Receiver

pytestmark = pytest.mark.e2e

DEMO = Path(__file__).resolve().parents[2] / "launcher" / "sandbox" / "demo_trainer.py"
NODES = (300, 301)
MASTER = address(NODES[0])
GPU_DEVICE = "/dev/nvidia0"  # the sandbox GPU device, as CUDA opens it
# The run prints what it was given, then trains: the env reaches the command through the run
# file (never a command line), so the shell expands it here.
ECHO_ENV = (
    'echo "rendezvous NNODES=$NNODES NODE_RANK=$NODE_RANK MASTER_ADDR=$MASTER_ADDR '
    'MASTER_PORT=$MASTER_PORT JOB_ID=$JOB_ID"; exec python3 train_demo.py'
)
LAUNCHER = (sys.executable, "-m", "launcher", "-i")
VERIFY_LONG = ("job", "verify", "train", "--wait", "60", "--successes", "1000", "--json")
HOLD = ("--", "python3", "-c")
WATCH = ("job", "watch", "train", "--interval", "1", "--for", "45", "--restart-on-failure")
WATCH += ("--max-restarts", "1")
LEFTOVERS = "tmux kill-server 2>/dev/null; pkill -KILL -f '[t]rain_demo|[g]pu-holder'; true"


@pytest.fixture(scope="module")
def net_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Sandbox, SandboxInfo]]:
    """Two containers that reach each other (launcher.sandbox.network), removed at the end."""
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    sb = Sandbox(tmp_path_factory.mktemp("netsandbox"), stock_home=True)
    try:
        info = sb.up(NODES, gpus=2)
        sb.connect(NODES)
        warm_agent_cache(sb, NODES)
        yield sb, info
    finally:
        sb.down()


@pytest.fixture
def job_project(net_sandbox: tuple[Sandbox, SandboxInfo], tmp_path: Path) -> Iterator[Project]:
    sb, info = net_sandbox
    project = Project(tmp_path / "project", sb, info)
    yield project
    for vmid in NODES:
        sb.ct_exec(vmid, ["sh", "-c", LEFTOVERS])


def write_job(
    project: Project,
    *,
    host: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    **job: Any,
) -> Path:
    book = project.playbook("jobdemo", command=ECHO_ENV, gpus=2, env=env or {})
    project.write({"n0": (NODES[0], book), "n1": (NODES[1], book)}, host=host)
    inventory = yaml.safe_load(project.inventory.read_text())
    inventory["jobs"] = {
        "train": {"nodes": ["n0", "n1"], "playbook": "playbooks/n0.yaml", "master_port": 29511}
    }
    inventory["jobs"]["train"].update(job)
    project.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
    return project.inventory


def job_json(project: Project, *args: str, timeout: float = 120) -> tuple[int, Any, str]:
    """`launcher job ARGS --json`: its exit code, its document (checked against the command's
    shipped schema; `job status` gives its list of jobs) and its stderr."""
    result = project.launcher("job", *args, "--json", timeout=timeout)
    assert result.stdout, result.stderr
    document = json.loads(result.stdout)
    jsonschema.Draft202012Validator(shipped(f"job-{args[0]}")).validate(document)
    assert document["exit_code"] == result.returncode
    found = document["targets"] if args[0] == "status" else document
    return result.returncode, found, result.stderr


def session_pid(project: Project, vmid: int) -> str:
    out = project.ct_text(vmid, "tmux", "display-message", "-p", "-t", "=jobdemo:", "#{pane_pid}")
    return out.strip()


def deploy_and_wait(project: Project) -> dict[str, Any]:
    code, report, stderr = job_json(project, "deploy", "--restart", "train")
    assert code == 0, stderr
    project.wait_for(
        lambda: project.launcher("job", "status", "train").returncode == 0,
        timeout=30,
        what="a healthy job",
    )
    return report  # type: ignore[no-any-return]


def test_job_env_one_run_id_verdict_status_and_stop(job_project: Project) -> None:
    project = job_project
    write_job(project)
    report = deploy_and_wait(project)
    run_id = report["run_id"]
    assert [n["state"] for n in report["nodes"]] == ["launched", "launched"]
    assert report["master"] == MASTER
    for rank, vmid in enumerate(NODES):
        log = project.ct_text(vmid, "cat", "/root/jobdemo/.launcher/jobdemo.log")
        assert (
            f"rendezvous NNODES=2 NODE_RANK={rank} MASTER_ADDR={MASTER} MASTER_PORT=29511 "
            f"JOB_ID=train-{run_id}"
        ) in log
        # The values travel in the 0600 run file, on no command line.
        assert MASTER not in project.ct_text(vmid, "ps", "-eo", "args=")
        mode = project.ct_text(vmid, "stat", "-c", "%a", "/root/jobdemo/.launcher/jobdemo.run")
        assert mode.strip() == "600"
        records = project.ct_text(vmid, "cat", "/root/jobdemo/.launcher/deploys.jsonl")
        last = json.loads(records.strip().splitlines()[-1])
        assert last["run"] == f"jobdemo:{run_id}" and last["job"] == "train"

    code, history, stderr = job_json(project, "history", "train")
    assert code == 0, stderr
    assert history["runs"][0]["run_id"] == run_id
    assert history["runs"][0]["outcomes"] == {"n0": "launched", "n1": "launched"}

    # The job is warm already (deploy_and_wait saw it healthy): a short warmup, then the polls
    # that must pass.
    code, verdict, stderr = job_json(project, "verify", "train", "--wait", "2")
    assert code == 0, stderr
    assert verdict["summary"].startswith("healthy: 2 node(s)")
    assert [n["state"] for n in verdict["nodes"]] == ["healthy", "alive"]

    status = project.launcher("job", "status", "train")
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0].startswith("job train: healthy") and len(lines) == 3
    assert "rank 0  n0" in lines[1] and "rank 1  n1" in lines[2] and "alive" in lines[2]

    code, stopped, stderr = job_json(project, "stop", "train")
    assert code == 0, stderr
    assert [n["state"] for n in stopped["nodes"]] == ["stopped", "stopped"]
    for vmid in NODES:
        assert project.processes(vmid, "train_demo") == []
        assert project.ct(vmid, "tmux", "has-session", "-t", "=jobdemo").returncode != 0
    code, after, _ = job_json(project, "status", "train")
    assert code == 1 and after[0]["nodes"][1]["state"] == "dead"


def test_node1_killed_during_verify_makes_the_job_unhealthy_naming_node1(
    job_project: Project,
) -> None:
    project = job_project
    write_job(project)
    deploy_and_wait(project)
    started = time.monotonic()
    verify = subprocess.Popen(
        [*LAUNCHER, str(project.inventory), *VERIFY_LONG],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(3)
    project.ct(NODES[1], "pkill", "-KILL", "-f", "train_demo")
    out, err = verify.communicate(timeout=60)
    elapsed = time.monotonic() - started
    assert verify.returncode == 1, err
    report = json.loads(out)
    assert report["summary"].startswith("unhealthy: n1 (rank 1): the run exited"), report
    assert report["nodes"][1]["state"] == "dead"
    assert elapsed < 30  # the dead node ends the probe; it does not wait out --wait


def test_dead_node1_before_verify_is_reported(job_project: Project) -> None:
    project = job_project
    write_job(project)
    deploy_and_wait(project)
    project.kill_session(NODES[1], "jobdemo")
    code, report, _ = job_json(project, "verify", "train", "--wait", "20")
    assert code == 1
    assert report["summary"] == "unhealthy: n1 (rank 1): no session: the run is gone"


def test_a_restart_on_node1_makes_the_job_unhealthy(job_project: Project) -> None:
    """Node 1's supervisor restarted its workers (torchrun's line): the job's verdict."""
    project = job_project
    restart = '[ "$NODE_RANK" = 1 ] && echo "[default] Restarting worker group"; '
    book = project.playbook("jobdemo", command=restart + ECHO_ENV, gpus=2)
    project.write({"n0": (NODES[0], book), "n1": (NODES[1], book)})
    inventory = yaml.safe_load(project.inventory.read_text())
    inventory["jobs"] = {"train": {"nodes": ["n0", "n1"], "playbook": "playbooks/n0.yaml"}}
    project.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
    code, _, stderr = job_json(project, "deploy", "--restart", "train")
    assert code == 0, stderr
    code, report, _ = job_json(project, "verify", "train", "--wait", "20")
    assert code == 1
    assert report["summary"] == (
        "unhealthy: n1 (rank 1): restarted: [default] Restarting worker group"
    )
    code, status, _ = job_json(project, "status", "train")
    assert code == 1 and status[0]["nodes"][1]["state"] == "restarted"


def test_preflight_failure_on_node1_leaves_node0_running(job_project: Project) -> None:
    project = job_project
    write_job(project)
    before = deploy_and_wait(project)
    pids = [session_pid(project, vmid) for vmid in NODES]
    # A process outside the run holds a GPU on node 1: its deploy would refuse (exit 4).
    holder = (
        f"import time\nf = open({GPU_DEVICE!r}), open('/dev/nvidia-uvm')  # CUDA's\n"
        "time.sleep(600)  # gpu-holder\n"
    )
    subprocess.Popen(
        ["lxc-attach", "-n", str(NODES[1]), "-P", str(project.sandbox.lxcpath), *HOLD, holder],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    project.wait_for(
        lambda: "gpu-holder" in project.ct_text(NODES[1], "ps", "-eo", "args="), what="holder"
    )
    code, report, stderr = job_json(project, "deploy", "--restart", "train")
    assert code == 4, stderr
    assert report["summary"].startswith("nothing changed on any node: checks failed on n1")
    n0, n1 = report["nodes"]
    assert n0["state"] == "unchanged" and n1["state"] == "failed"
    assert "gpu-holder" in n1["detail"] or "GPU" in n1["detail"]
    # Node 0's old run was never stopped: same pane process, same run.
    assert [session_pid(project, vmid) for vmid in NODES] == pids
    code, verdict, _ = job_json(project, "status", "train")
    assert code == 0 and verdict[0]["run_id"] == before["run_id"]
    # Asked to, the launch kills the holder: the stops before it leave that to it.
    code, report, stderr = job_json(project, "deploy", "--restart", "--kill-gpu-holders", "train")
    assert code == 0, stderr
    assert [n["state"] for n in report["nodes"]] == ["launched", "launched"]
    assert "gpu-holder" not in project.ct_text(NODES[1], "ps", "-eo", "args=")


def test_dry_run_shows_every_nodes_plan_and_changes_nothing(job_project: Project) -> None:
    project = job_project
    write_job(project)
    result = project.launcher("job", "deploy", "--restart", "--dry-run", "train")
    assert result.returncode == 0, result.stderr
    assert "dry run: every node's checks passed" in result.stdout
    for node in ("n0", "n1"):
        assert f"[{node}]" in result.stderr
    for vmid in NODES:
        assert project.ct(vmid, "tmux", "has-session", "-t", "=jobdemo").returncode != 0


def test_an_unreachable_master_port_is_refused_before_the_stop(job_project: Project) -> None:
    """Rank 0's master port is probed from every node (a listener on rank 0) before anything
    is stopped: an address nobody answers on, then a firewall on rank 0 that drops the port,
    each refuse the deploy naming the node that cannot reach it; the old run keeps running."""
    project = job_project
    write_job(project)
    before = deploy_and_wait(project)
    pids = [session_pid(project, vmid) for vmid in NODES]
    write_job(project, addresses={"n0": "10.213.0.250"})
    code, report, _ = job_json(project, "deploy", "--restart", "train")
    assert code == 3, report
    assert report["summary"].startswith(
        "nothing changed on any node: rank 0's master port 10.213.0.250:29511 is not reachable "
        "from n1 ("
    ), report["summary"]
    assert "allow TCP to 10.213.0.250:29511" in report["summary"]
    write_job(project)
    for rule in DROP_MASTER_PORT:
        project.ct(NODES[0], "nft", *rule)
    try:
        started = time.monotonic()
        code, report, stderr = job_json(project, "deploy", "--restart", "train")
        assert code == 3, stderr
        assert f"rank 0's master port {MASTER}:29511 is not reachable from n1" in report["summary"]
        assert time.monotonic() - started < 30  # the probe is bounded
    finally:
        project.ct(NODES[0], "nft", "delete", "table", "inet", "launchertest")
    assert [n["state"] for n in report["nodes"]] == ["unchanged", "failed"]
    assert [session_pid(project, vmid) for vmid in NODES] == pids
    code, status, _ = job_json(project, "status", "train")
    assert code == 0 and status[0]["run_id"] == before["run_id"]


DROP_MASTER_PORT = (
    ("add", "table", "inet", "launchertest"),
    ("add", "chain", "inet", "launchertest", "input",
     "{ type filter hook input priority 0 ; }"),
    ("add", "rule", "inet", "launchertest", "input", "tcp", "dport", "29511", "drop"),
)  # fmt: skip


# The one-line torchrun (through ddp_job.py's wrapper for bookworm's torch 1.13 on Python
# 3.11): every other option comes from the PET_* variables launcher gives each node.
TORCHRUN = "python3 ddp_job.py --torchrun --nproc_per_node 1 ddp_job.py"


@pytest.mark.skipif(not host_has_torch(), reason="needs Debian's python3-torch on the host")
@pytest.mark.parametrize(
    ("hosts", "manage_hosts", "backend"),
    [
        ("static", False, "static"),
        ("dhcp", False, "static"),
        ("all", False, "c10d"),
        ("dhcp", True, "c10d"),
    ],
)
def test_real_torchrun_across_two_containers_is_healthy(
    job_project: Project, hosts: str, manage_hosts: bool, backend: str
) -> None:
    """Two CTs whose /etc/hosts is as Proxmox writes it, own name only: on its static address,
    or on 127.0.1.1 (DHCP); neither resolves the other's name, so the static rendezvous by
    address. With every name in every file (as DNS would), or written there by launcher
    (manage_hosts), the c10d rendezvous."""
    project = job_project
    project.sandbox.connect(NODES, hosts=hosts)
    try:
        one_line_torchrun(project, backend, manage_hosts=manage_hosts)
    finally:
        project.sandbox.connect(NODES)


def one_line_torchrun(project: Project, backend: str, *, manage_hosts: bool) -> None:
    book = project.playbook(
        "ddp",
        script={"source": str(Path(__file__).with_name("ddp_job.py")), "dest": "ddp_job.py"},
        command=TORCHRUN,
        gpus=0,
        stop_grace=10,
        # CPU throughput on a shared machine swings by half: judge it alive, not steady. A
        # short warmup: the test waits for the job's first status line itself (below).
        verify={"wait": 6, "interval": 2, "successes": 3, "throughput": {"drop": None}},
    )
    project.write({"n0": (NODES[0], book), "n1": (NODES[1], book)})
    inventory = yaml.safe_load(project.inventory.read_text())
    inventory["jobs"] = {
        "train": {
            "nodes": ["n0", "n1"],
            "playbook": "playbooks/n0.yaml",
            "manage_hosts": manage_hosts,
        }
    }
    project.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))

    code, deployed, stderr = job_json(project, "deploy", "--restart", "train")
    assert code == 0, stderr
    assert deployed["rendezvous"] == backend, stderr
    if manage_hosts:  # each node names the other, in a block of launcher's own
        block = project.ct_text(NODES[1], "cat", "/etc/hosts")
        assert f"{MASTER} sandbox-{NODES[0]}" in block and "BEGIN LAUNCHER JOB train" in block
    # Four processes load torch and meet at the rendezvous: from a few seconds on a quiet
    # machine to a minute on a busy one. The verdict is judged on the training that follows,
    # not on a warmup long enough for the slowest start.
    log = "/root/ddp/.launcher/ddp.log"
    project.wait_for(
        lambda: "step=" in project.ct_text(NODES[0], "cat", log), 150, "the job's first step"
    )
    code, verdict, stderr = job_json(project, "verify", "train", timeout=150)
    assert code == 0, (verdict, stderr)
    assert [n["state"] for n in verdict["nodes"]] == ["healthy", "alive"]
    assert "ddp: 2 node(s), world size 2" in project.ct_text(NODES[0], "cat", log)

    code, _, stderr = job_json(project, "stop", "train")
    assert code == 0, stderr
    for vmid in NODES:
        assert project.processes(vmid, "ddp_job") == []


def test_a_failure_after_the_stops_is_reported_per_node(job_project: Project) -> None:
    """The launch fails on every node after the old runs stopped (a script too large to travel
    inline arrives cut in half: its sha256 does not match): each node says where it was left."""
    project = job_project
    big = project.root / "big_trainer.py"
    project.root.mkdir(parents=True, exist_ok=True)
    big.write_text(DEMO.read_text() + "#" * (5 * 1024 * 1024) + "\n")
    book = project.playbook("jobdemo", gpus=2, script={"source": str(big), "dest": "train_demo.py"})
    project.write({"n0": (NODES[0], book), "n1": (NODES[1], book)})
    inventory = yaml.safe_load(project.inventory.read_text())
    inventory["jobs"] = {"train": {"nodes": ["n0", "n1"], "playbook": "playbooks/n0.yaml"}}
    project.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
    deploy_and_wait(project)
    project.sandbox.set_faults(partial_push=True)
    try:
        code, report, stderr = job_json(project, "deploy", "--restart", "train")
    finally:
        project.sandbox.set_faults()
    assert code == 3, stderr
    assert report["summary"] == (
        "launch failed on every node; their old runs were stopped: nothing runs"
    )
    for node in report["nodes"]:
        assert node["state"] == "failed"
        assert node["detail"].startswith("not launched; old run stopped: ")
    for vmid in NODES:
        assert project.processes(vmid, "train_demo") == []


def test_a_launch_failing_on_one_node_leaves_no_node_running(job_project: Project) -> None:
    """Only node 1's push arrives cut (its sha256 does not match): node 0, which launched, is
    stopped again, never left waiting at the rendezvous; --keep-partial leaves it running."""
    project = job_project
    big = project.root / "big_trainer.py"
    project.root.mkdir(parents=True, exist_ok=True)
    big.write_text(DEMO.read_text() + "#" * (5 * 1024 * 1024) + "\n")
    book = project.playbook("jobdemo", gpus=2, script={"source": str(big), "dest": "train_demo.py"})
    project.write({"n0": (NODES[0], book), "n1": (NODES[1], book)})
    inventory = yaml.safe_load(project.inventory.read_text())
    inventory["jobs"] = {"train": {"nodes": ["n0", "n1"], "playbook": "playbooks/n0.yaml"}}
    project.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
    project.sandbox.set_faults(partial_push=[NODES[1]])
    try:
        code, report, stderr = job_json(project, "deploy", "--restart", "train")
        assert code == 3, stderr
        assert report["summary"] == (
            "failed: launch failed on n1 (rank 1); stopped again on n0: nothing runs"
        )
        assert [n["state"] for n in report["nodes"]] == ["stopped", "failed"]
        for vmid in NODES:
            assert project.processes(vmid, "train_demo") == []
        code, report, stderr = job_json(project, "deploy", "--restart", "--keep-partial", "train")
        assert code == 3, stderr
        assert [n["state"] for n in report["nodes"]] == ["launched", "failed"]
        assert project.processes(NODES[0], "train_demo") != []
    finally:
        project.sandbox.set_faults()


def test_a_stopped_container_fails_its_check_and_changes_nothing(job_project: Project) -> None:
    project = job_project
    write_job(project)
    before = deploy_and_wait(project)
    pid0 = session_pid(project, NODES[0])
    project.sandbox.stop_container(NODES[1])
    try:
        code, report, stderr = job_json(project, "deploy", "--restart", "train")
        assert code == 3, stderr
        # The network check, the first to ask every node, finds it.
        assert report["summary"].startswith(
            "nothing changed on any node: network check: n1 (sandbox CT 301): container 301 "
            "not running"
        ), report["summary"]
        assert [n["state"] for n in report["nodes"]] == ["unchanged", "failed"]
        assert session_pid(project, NODES[0]) == pid0
        code, status, _ = job_json(project, "status", "train")
        assert code == 3 and status[0]["nodes"][1]["state"] == "unreachable"
        assert status[0]["run_id"] == before["run_id"]
    finally:
        project.sandbox.start_container(NODES[1])
        project.sandbox.connect(NODES)


def test_rank0_without_a_usable_address_stops_the_deploy_before_any_check(
    job_project: Project,
) -> None:
    """`hostname -I` on rank 0 gives nothing other nodes could reach: exit 3 with the hint to
    configure the address; nothing is sent to any node."""
    project = job_project
    write_job(project)
    project.ct(NODES[0], "ip", "addr", "flush", "dev", "eth0")
    try:
        result = project.launcher("job", "deploy", "--restart", "train")
        assert result.returncode == 3, result.stderr
        assert "has no address the other nodes can reach" in result.stdout
        assert "set jobs.train.addresses.n0 in the inventory" in result.stdout
        assert "[n0]" not in result.stderr and "[n1]" not in result.stderr
    finally:
        project.ct(NODES[0], "ip", "addr", "add", f"{MASTER}/24", "dev", "eth0")


def test_watch_restarts_the_whole_job_when_node1_dies(job_project: Project, tmp_path: Path) -> None:
    """Node 1's run killed: `job watch --restart-on-failure` redeploys every node (a new run
    id on both, checkpoints kept) once and ends healthy, as `launcher watch` would: each
    transition an event to --exec and the state file, each node's status and GPUs in the
    metrics; SIGTERM then ends the watch with 0. What a target's watch does, a job's does:
    the same --webhook bodies, the same state file record."""
    project = job_project
    write_job(project)
    before = deploy_and_wait(project)
    kinds = tmp_path / "kinds.txt"
    state = tmp_path / "job-watch.json"
    port = free_port()
    receiver = Receiver()
    notify = ("--exec", f"sh -c 'echo $LAUNCHER_EVENT_KIND $LAUNCHER_EVENT_TARGET >> {kinds}'")
    notify += ("--webhook", receiver.url)
    outlets = (*notify, "--state", str(state), "--metrics-port", str(port))
    scraped = ""
    with (tmp_path / "watch.err").open("w+") as err:
        watch = subprocess.Popen(
            [*LAUNCHER, str(project.inventory), *WATCH, "--restart-backoff", "1", *outlets],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        # --for is the bound; the test ends the watch by SIGTERM once it saw what it checks.
        killer = threading.Timer(120, watch.kill)
        killer.start()
        try:
            assert watch.stdout is not None
            seen = []
            for line in watch.stdout:
                seen.append(line)
                if len(seen) == 1:  # the first poll judged the job: now node 1 dies
                    assert "job train: healthy: 2 node(s)" in line, line
                    project.ct(NODES[1], "pkill", "-KILL", "-f", "train_demo")
                if "after the restart:" in line:
                    # The polls after the restart export every node healthy again.
                    scraped = until_scraped(port, N1_HEALTHY, timeout=30)
                    watch.send_signal(signal.SIGTERM)
            watch.wait(timeout=60)
        finally:
            killer.cancel()
            receiver.close()
        out = "".join(seen)
        err.seek(0)
        assert watch.returncode == 0, (out, err.read())
    assert "unhealthy: n1 (rank 1): the run exited (status 137)" in out
    assert "restarting in 1 s (backoff)" in out and "restarting the job (1/1)" in out
    assert "after the restart: healthy: 2 node(s)" in out
    assert seen[-1].endswith("job train: watch ended by SIGTERM\n")
    # The notifier delivered each transition (a healthy one is recorded, not sent; it drains
    # before the watch ends), and the state's events log holds them all.
    delivered = kinds.read_text().splitlines()
    assert delivered[:2] == ["unhealthy train", "restart train"], delivered
    logged = state.with_suffix(".events.jsonl").read_text().splitlines()
    assert [json.loads(line)["kind"] for line in logged][:3] == ["healthy", "unhealthy", "restart"]
    posted = [body for _, body in receiver.received]
    assert [b["kind"] for b in posted][:2] == ["unhealthy", "restart"], posted
    assert {(b["schema"], b["target"], b["vmid"]) for b in posted} == {
        ("launcher.watch.event/1", "train", NODES[0])
    }
    # Metrics per node: status, and each node's GPUs (the sandbox gives each node two).
    for node, vmid in zip(("n0", "n1"), NODES, strict=True):
        held = f'gpu="1",host="sandbox",target="{node}",vmid="{vmid}"'
        assert f"launcher_gpu_held_by_run{{{held}}} 1.0" in scraped, scraped
        status = f'host="sandbox",status="healthy",target="{node}",vmid="{vmid}"'
        assert f"launcher_watch_status{{{status}}} 1.0" in scraped
    assert 'launcher_watch_restarts_total{host="sandbox",target="n0",vmid="300"} 1.0' in scraped
    code, status, _ = job_json(project, "status", "train")
    assert code == 0 and status[0]["run_id"] != before["run_id"]
    history = json.loads(project.launcher("job", "history", "train", "--json").stdout)
    assert history["runs"][0]["outcomes"] == {"n0": "launched", "n1": "launched"}
    # The job's record is a target's record: the run it launched named, its restart counted.
    record = json.loads(state.read_text())["targets"]["train"]
    assert set(record) == {f.name for f in dataclasses.fields(TargetRecord)}
    assert record["run"] == record["launched"] == status[0]["run_id"]
    assert (record["status"], len(record["restarts"]), record["bad"]) == ("healthy", 1, False)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# prometheus_client prints a series' labels sorted by name.
N1_HEALTHY = 'launcher_watch_status{host="sandbox",status="healthy",target="n1",vmid="301"} 1.0'


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


def until_scraped(port: int, wanted: str, timeout: float) -> str:
    """The metrics page once it holds `wanted`."""
    deadline = time.monotonic() + timeout
    text = scrape(port)
    while wanted not in text:
        assert time.monotonic() < deadline, f"no {wanted!r} in:\n{text}"
        time.sleep(0.5)
        text = scrape(port)
    return text


def test_a_job_that_finishes_is_finished_and_never_restarted(job_project: Project) -> None:
    """Both nodes train a few steps and exit 0, as a job ends: `job watch
    --restart-on-failure` reports it finished and redeploys nothing; `job status` says
    finished, exit 0."""
    project = job_project
    write_job(project, env={"DEMO_STEPS": "12"})
    code, deployed, stderr = job_json(project, "deploy", "--restart", "train")
    assert code == 0, stderr
    watch = ("job", "watch", "train", "--interval", "1", "--for", "25", "--restart-on-failure")
    watch += ("--state", str(project.root / "watch-state.json"))
    watched = project.launcher(*watch, timeout=90)
    assert watched.returncode == 0, watched.stdout + watched.stderr
    assert "job train: finished: 2 node(s)" in watched.stdout, watched.stdout
    assert "restarting" not in watched.stdout and "unhealthy" not in watched.stdout
    code, statuses, _ = job_json(project, "status", "train")
    status = statuses[0]
    assert code == 0 and status["summary"].startswith("finished: 2 node(s)"), status
    assert [node["state"] for node in status["nodes"]] == ["finished", "finished"]
    history = json.loads(project.launcher("job", "history", "train", "--json").stdout)
    assert history["runs"][0]["run_id"] == deployed["run_id"]  # the newest: no restart since


def test_the_python_api_runs_a_job_as_the_cli_does(job_project: Project) -> None:
    """`Launcher.jobs`: deploy, verify, status, history, logs and stop of the two-node job,
    through the functions `launcher job` calls."""
    project = job_project
    write_job(project)
    progress: list[str] = []
    with Launcher(project.inventory, on_line=progress.append) as launcher:
        deployed = launcher.jobs.deploy("train", restart=True)
        assert deployed.exit_code == ExitCode.OK, deployed.summary
        verified = launcher.jobs.verify("train", wait=20)
        assert verified.exit_code == ExitCode.OK, verified.summary
        assert verified.summary == f"healthy: 2 node(s) in run {deployed.run_id}"
        [status] = launcher.jobs.status("train")
        assert status.exit_code == ExitCode.OK and status.run_id == deployed.run_id
        assert launcher.jobs.history("train", limit=1).runs[0].run_id == deployed.run_id
        shown: list[tuple[str, str]] = []
        logs = launcher.jobs.logs("train", tail=5, on_line=lambda n, line: shown.append((n, line)))
        assert logs.exit_code == ExitCode.OK and {n for n, _ in shown} == {"n0", "n1"}
        stopped = launcher.jobs.stop("train")
        assert stopped.exit_code == ExitCode.OK, stopped.summary
    assert any(line.startswith("[n1] ") for line in progress), progress
    for vmid in NODES:
        assert project.processes(vmid, "train_demo.py") == []


def write_versioned_job(project: Project, version: str) -> str:
    """The job's script as version `version` (the demo trainer and a line naming it); its
    sha256."""
    source = project.root / "versioned_trainer.py"
    source.parent.mkdir(parents=True, exist_ok=True)
    text = DEMO.read_text() + f"# version {version}\n"
    source.write_text(text)
    book = project.playbook(
        "jobdemo", command=ECHO_ENV, gpus=2, script={"source": str(source), "dest": "train_demo.py"}
    )
    project.write({"n0": (NODES[0], book), "n1": (NODES[1], book)})
    inventory = yaml.safe_load(project.inventory.read_text())
    inventory["jobs"] = {
        "train": {"nodes": ["n0", "n1"], "playbook": "playbooks/n0.yaml", "master_port": 29511}
    }
    project.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
    return hashlib.sha256(text.encode()).hexdigest()


def script_sha(project: Project, vmid: int) -> str:
    return project.ct_text(vmid, "sha256sum", "/root/jobdemo/train_demo.py").split()[0]


def last_record(project: Project, vmid: int) -> dict[str, Any]:
    records = project.ct_text(vmid, "cat", "/root/jobdemo/.launcher/deploys.jsonl")
    return json.loads(records.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_rollback_after_two_deploys_runs_the_first_version_on_both_nodes(
    job_project: Project,
) -> None:
    project = job_project
    first = write_versioned_job(project, "one")
    deploy_and_wait(project)
    second = write_versioned_job(project, "two")
    deploy_and_wait(project)
    assert [script_sha(project, vmid) for vmid in NODES] == [second, second]

    # Checks alone first: nothing changes.
    code, plan, stderr = job_json(project, "rollback", "--restart", "--dry-run", "train")
    assert code == 0, stderr
    assert [n["state"] for n in plan["nodes"]] == ["planned", "planned"]
    assert [script_sha(project, vmid) for vmid in NODES] == [second, second]

    code, report, stderr = job_json(project, "rollback", "--restart", "train")
    assert code == 0, stderr
    run_id = report["run_id"]
    assert [n["state"] for n in report["nodes"]] == ["launched", "launched"]
    assert report["summary"].startswith(f"rolled back to run {run_id} (sha256 {first[:12]})")
    for rank, vmid in enumerate(NODES):
        assert script_sha(project, vmid) == first
        record = last_record(project, vmid)
        assert record["run"] == f"jobdemo:{run_id}" and record["job"] == "train"
        assert record["rollback"] is True and record["rolled_back_from"] == second
        # The rolled-back run meets the other ranks as a deploy's does.
        log = project.ct_text(vmid, "cat", "/root/jobdemo/.launcher/jobdemo.log")
        assert f"NODE_RANK={rank} MASTER_ADDR={MASTER} MASTER_PORT=29511 JOB_ID=train-{run_id}" in (
            log
        )
    project.wait_for(
        lambda: project.launcher("job", "status", "train").returncode == 0,
        timeout=30,
        what="a healthy job after the rollback",
    )
    code, status, _ = job_json(project, "status", "train")
    assert code == 0 and status[0]["run_id"] == run_id
    code, history, _ = job_json(project, "history", "train")
    assert history["runs"][0]["run_id"] == run_id
    assert history["runs"][0]["outcomes"] == {"n0": "launched", "n1": "launched"}


def test_rollback_whose_check_fails_on_node1_leaves_node0_running(job_project: Project) -> None:
    project = job_project
    write_versioned_job(project, "one")
    deploy_and_wait(project)
    second = write_versioned_job(project, "two")
    before = deploy_and_wait(project)
    pids = [session_pid(project, vmid) for vmid in NODES]
    project.ct(NODES[1], "rm", "/root/jobdemo/train_demo.py.prev")

    code, report, stderr = job_json(project, "rollback", "--restart", "train")
    assert code == 4, stderr
    assert report["summary"] == "nothing changed on any node: checks failed on n1 (rank 1)"
    n0, n1 = report["nodes"]
    assert n0["state"] == "unchanged" and n1["state"] == "failed"
    assert "no previous version" in n1["detail"]
    # Node 0 was neither stopped nor rolled back.
    assert [session_pid(project, vmid) for vmid in NODES] == pids
    assert [script_sha(project, vmid) for vmid in NODES] == [second, second]
    code, status, _ = job_json(project, "status", "train")
    assert code == 0 and status[0]["run_id"] == before["run_id"]


def test_rollback_without_restart_refuses_while_the_job_runs(job_project: Project) -> None:
    project = job_project
    write_versioned_job(project, "one")
    deploy_and_wait(project)
    write_versioned_job(project, "two")
    deploy_and_wait(project)
    pids = [session_pid(project, vmid) for vmid in NODES]
    code, report, _ = job_json(project, "rollback", "train")
    assert code == 4
    assert [n["state"] for n in report["nodes"]] == ["failed", "failed"]
    assert [session_pid(project, vmid) for vmid in NODES] == pids


def test_job_logs_prefixes_every_node_and_picks_one(job_project: Project) -> None:
    project = job_project
    write_job(project)
    deploy_and_wait(project)
    result = project.launcher("job", "logs", "--tail", "500", "train")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("[n0] rendezvous NNODES=2 NODE_RANK=0") for line in lines)
    assert any(line.startswith("[n1] rendezvous NNODES=2 NODE_RANK=1") for line in lines)
    assert all(line.startswith(("[n0] ", "[n1] ")) for line in lines)

    one = project.launcher("job", "logs", "--node", "n1", "--tail", "500", "train")
    assert one.returncode == 0, one.stderr
    assert one.stdout and all(line.startswith("[n1] ") for line in one.stdout.splitlines())
    assert "NODE_RANK=1" in one.stdout and "NODE_RANK=0" not in one.stdout

    unknown = project.launcher("job", "logs", "--node", "n7", "train")
    assert unknown.returncode == 2
    assert "no node 'n7'" in unknown.stderr and "n0, n1" in unknown.stderr


def test_job_logs_without_a_run_on_node1_says_so(job_project: Project) -> None:
    project = job_project
    write_job(project)
    deploy_and_wait(project)
    project.kill_session(NODES[1], "jobdemo")
    result = project.launcher("job", "logs", "--raw", "train")
    assert result.returncode == 1
    assert "[n0] " in result.stdout and "[n1] " not in result.stdout
    assert "[n1] no session 'jobdemo'" in result.stderr


def from_node(lines: list[str], node: str) -> int:
    return sum(line.startswith(f"[{node}] ") for line in lines)


def read_until(
    proc: subprocess.Popen[str], done: Callable[[list[str]], bool], timeout: float = 30
) -> list[str]:
    """proc's stdout lines until `done(lines)` holds (a wait on what it printed, not a sleep);
    a timer ends proc if that never comes, and the test fails on what was read."""
    assert proc.stdout is not None
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if done(lines):
                return lines
    finally:
        killer.cancel()
    raise AssertionError(f"ended before the expected lines: {lines}")


def follow_job_logs(project: Project) -> subprocess.Popen[str]:
    """`launcher job logs -f --tail 1 train`, its output read by the test."""
    return subprocess.Popen(
        [*LAUNCHER, str(project.inventory), "job", "logs", "-f", "--tail", "1", "train"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_job_logs_follow_shows_both_nodes_until_the_job_stops(job_project: Project) -> None:
    project = job_project
    write_job(project)
    deploy_and_wait(project)
    follow = follow_job_logs(project)
    # The tail's line and new ones from both nodes (the demo trainer prints every few tenths
    # of a second), then the job stops under the follow.
    lines = read_until(follow, lambda seen: all(from_node(seen, n) > 2 for n in ("n0", "n1")))
    assert follow.poll() is None, follow.communicate()
    code, _, stderr = job_json(project, "stop", "train")
    assert code == 0, stderr
    out, err = follow.communicate(timeout=60)
    assert follow.returncode == 0, err
    lines += out.splitlines()
    for node in ("n0", "n1"):
        mine = [line for line in lines if line.startswith(f"[{node}] ")]
        assert len(mine) > 2, (node, out)  # the tail's one line and new ones
        assert f"[{node}] the run ended" in err
    assert all(line.startswith(("[n0] ", "[n1] ")) for line in lines)


def test_job_logs_follow_ends_on_ctrl_c_and_leaves_the_runs(job_project: Project) -> None:
    project = job_project
    write_job(project)
    before = deploy_and_wait(project)
    follow = follow_job_logs(project)
    seen = read_until(follow, lambda seen: all(from_node(seen, n) > 2 for n in ("n0", "n1")))
    follow.send_signal(signal.SIGINT)
    out, err = follow.communicate(timeout=30)
    assert follow.returncode == 0, err
    out = "\n".join(seen) + "\n" + out
    assert "[n0] " in out and "[n1] " in out
    assert "[n0] stopped following; the run goes on" in err
    assert "[n1] stopped following; the run goes on" in err
    code, status, _ = job_json(project, "status", "train")
    assert code == 0 and status[0]["run_id"] == before["run_id"]


@pytest.mark.parametrize("persisted", [False, True], ids=["own-connection", "persisted"])
def test_job_logs_follow_ends_on_ctrl_c_right_after_the_first_lines(
    job_project: Project, persisted: bool
) -> None:
    """Ctrl-C while a node's follow may still be starting (its tail printed, its stream not yet
    open): every node's follow ends at once; none opens a connection of its own afterwards.
    Through a persisted connection too, whose streams run in the background process: closing
    the connection shuts their sockets, and the process cuts the commands off."""
    project = job_project
    write_job(project, host=project.host(control_persist=30) if persisted else None)
    before = deploy_and_wait(project)
    follow = follow_job_logs(project)
    read_until(follow, lambda seen: all(from_node(seen, n) >= 1 for n in ("n0", "n1")))
    follow.send_signal(signal.SIGINT)
    started = time.monotonic()
    _, err = follow.communicate(timeout=30)
    assert follow.returncode == 0, err
    assert time.monotonic() - started < 10, err
    assert "[n0] stopped following; the run goes on" in err
    assert "[n1] stopped following; the run goes on" in err
    code, status, _ = job_json(project, "status", "train")
    assert code == 0 and status[0]["run_id"] == before["run_id"]
    if persisted:
        ended = project.launcher("disconnect")
        assert ended.returncode == 0, ended.stderr


def test_rollback_refuses_when_the_nodes_previous_versions_differ(job_project: Project) -> None:
    """Node 1's previous version is not node 0's: the ranks would run different code."""
    project = job_project
    first = write_versioned_job(project, "one")
    deploy_and_wait(project)
    second = write_versioned_job(project, "two")
    deploy_and_wait(project)
    pids = [session_pid(project, vmid) for vmid in NODES]
    prev = "/root/jobdemo/train_demo.py.prev"
    project.ct(NODES[1], "sh", "-c", f"echo '# changed by hand' >> {prev}")
    other = project.ct_text(NODES[1], "sha256sum", prev).split()[0]

    code, report, stderr = job_json(project, "rollback", "--restart", "train")
    assert code == 4, stderr
    assert report["summary"] == (
        "nothing changed on any node: the nodes would run different versions "
        f"(n0 {first[:12]}, n1 {other[:12]})"
    )
    assert [n["state"] for n in report["nodes"]] == ["unchanged", "unchanged"]
    assert [session_pid(project, vmid) for vmid in NODES] == pids
    assert [script_sha(project, vmid) for vmid in NODES] == [second, second]
