"""Releases are immutable and self-contained, and a project deploy's memory is bounded, against
the sandbox: a setup cannot change another release (no shared inodes) nor its own release's
project files, nor remove `current` or `releases/*`, without failing the deploy before anything
is stopped; a reused setup's output names the new release's path, so pruning the release it
was built in breaks nothing; an endless setup output line is cut; a 300 MB project deploys in
a client of bounded memory."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.project import Project
from tests.e2e.test_releases import book as pkg_book
from tests.e2e.test_releases import make_package, release_info

pytestmark = pytest.mark.e2e

VMID = 200
NAME = "integrity"  # a workdir of its own: test_releases expects a CT without its releases
WORKDIR = f"/root/{NAME}"


def book(project: Project, src: Path, **extra: Any) -> dict[str, Any]:
    playbook = pkg_book(project, src, **extra)
    playbook.update({"name": NAME, "session": NAME, "workdir": WORKDIR})
    return playbook


def deploy_json(project: Project, *args: str) -> dict[str, Any]:
    result = project.launcher("deploy", "--restart", "--json", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data["results"][0] if "results" in data else data


def pane(project: Project) -> str:
    return project.ct_text(VMID, "cat", f"{WORKDIR}/.launcher/{NAME}.log")


def ct_sha256(project: Project, path: str) -> str:
    return project.ct_text(VMID, "sha256sum", path).split()[0]


def releases_state(project: Project) -> dict[str, str]:
    """Every file under releases/ (hidden ones too) with its sha256, and where `current` is."""
    out = project.ct_text(
        VMID, "sh", "-c", f"cd {WORKDIR} && find releases -type f -exec sha256sum {{}} +"
    )
    state = {line.split()[1]: line.split()[0] for line in out.splitlines()}
    state["current ->"] = project.ct_text(VMID, "readlink", f"{WORKDIR}/current").strip()
    return state


# A setup that writes where it must not. Each runs in the new release (cwd releases/<id>).
HOSTILE_SETUPS = {
    # Appends to a project file the new release shares with the old ones when they are hard
    # links (same inode): every release changed, the live one too.
    "append_then_succeed": ("echo '# x' >> trainer/part3.py", "release files changed"),
    "append_then_fail": ("echo '# x' >> trainer/part3.py; exit 1", "exited 1"),
    "remove_current": ("rm ../../current", "current was removed"),
    "remove_releases": ("rm -rf ../2*", "were removed or replaced"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_SETUPS))
def test_a_setup_changes_no_other_release_and_stops_nothing(project: Project, case: str) -> None:
    src = make_package(project.root)
    project.write({NAME: (VMID, book(project, src))})
    release_info(deploy_json(project))
    (src / "config.json").write_text(json.dumps({"version": "v2"}))
    second = release_info(deploy_json(project))
    project.wait_for(lambda: "TRAINER VERSION v2" in pane(project), what="v2 running")
    running = project.processes(VMID, "trainer")
    assert running
    before = releases_state(project)
    live = f"{WORKDIR}/releases/{second['id']}/trainer/part3.py"
    live_sha = ct_sha256(project, live)

    command, expected = HOSTILE_SETUPS[case]
    (src / "config.json").write_text(json.dumps({"version": "v3"}))
    project.write({NAME: (VMID, book(project, src, setup={"run": [command], "inputs": []}))})
    result = project.launcher("deploy", "--restart")
    assert result.returncode != 0, result.stdout + result.stderr
    assert expected in result.stderr and "nothing was stopped" in result.stderr, result.stderr
    assert project.processes(VMID, "trainer") == running  # the old run goes on
    if case.startswith("append"):
        assert ct_sha256(project, live) == live_sha  # the live release as it was
        assert releases_state(project) == before  # and every other, and `current`
    elif case == "remove_current":
        assert releases_state(project) == before  # `current` put back where it was
        assert "restored" in result.stderr
    else:
        # What setup removed is gone, but the deploy went no further: no switch, no stop.
        link = project.ct_text(VMID, "readlink", f"{WORKDIR}/current").strip()
        assert link == f"releases/{second['id']}"


def test_reused_setup_output_survives_pruning_the_release_it_was_built_in(
    project: Project,
) -> None:
    src = make_package(project.root)
    # A venv whose script names its python by absolute path, as pip's console scripts do.
    setup = {
        "run": [
            "python3 -m venv --without-pip --system-site-packages .venv",
            "printf '#!%s/.venv/bin/python\\nimport sys\\nprint(\"tool in\", sys.prefix)\\n' "
            '"$PWD" > .venv/bin/tool && chmod +x .venv/bin/tool',
        ],
        "inputs": ["requirements.txt"],
    }
    playbook = book(project, src, setup=setup, command=".venv/bin/python -m trainer")
    playbook["project"]["keep_releases"] = 1
    project.write({NAME: (VMID, playbook)})
    first = release_info(deploy_json(project))
    (src / "config.json").write_text(json.dumps({"version": "v2"}))
    result = project.launcher("deploy", "--restart", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "reused from releases/" in result.stdout + result.stderr
    data = json.loads(result.stdout)
    second = release_info(data["results"][0] if "results" in data else data)
    # The release the venv was built in is gone.
    assert project.ct_text(VMID, "ls", f"{WORKDIR}/releases").split() == [second["id"]]

    tool = project.ct(VMID, f"{WORKDIR}/current/.venv/bin/tool")
    assert tool.returncode == 0, tool.stdout + tool.stderr
    assert tool.stdout.decode().strip() == f"tool in {WORKDIR}/releases/{second['id']}/.venv"
    left = project.ct(VMID, "grep", "-rl", first["id"], f"{WORKDIR}/releases/{second['id']}")
    assert left.returncode == 1, left.stdout  # nothing names the pruned release
    project.wait_for(lambda: "TRAINER VERSION v2" in pane(project), what="v2 running")


def test_an_endless_setup_line_is_cut(project: Project) -> None:
    src = make_package(project.root)
    run = ["head -c 50000000 /dev/zero | tr '\\0' x; echo; echo setup-done"]
    project.write({NAME: (VMID, book(project, src, setup={"run": run, "inputs": []}))})
    result = project.launcher("deploy", "--restart")
    assert result.returncode == 0, result.stdout + result.stderr
    output = result.stdout + result.stderr
    assert "[line cut: 49995904 more bytes]" in output
    assert "setup-done" in output
    assert len(output) < 100_000


def make_big_tree(root: Path, total: int, files: int) -> Path:
    """`total` bytes in `files` files that gzip to about a quarter (so that the stream is
    pushed in pieces) and compress fast: each 64 KiB block a random quarter, then zeros."""
    rng = random.Random(41)
    (root / "trainer").mkdir(parents=True, exist_ok=True)
    (root / "data").mkdir()
    (root / "trainer" / "__init__.py").write_text("")
    (root / "trainer" / "__main__.py").write_text("print('BIG', flush=True)\n")
    block = 64 * 1024
    for n in range(files):
        with (root / "data" / f"shard{n:03}.bin").open("wb") as handle:
            for _ in range(total // files // block):
                handle.write(rng.randbytes(block // 4) + bytes(block - block // 4))
    return root


def max_rss_kib(argv: list[str], timeout: float) -> tuple[int, subprocess.CompletedProcess[str]]:
    """Run argv in a fresh process and return its peak RSS (KiB, getrusage of the only child
    of a wrapper process: nothing else it waited for counts) and its result."""
    wrapper = (
        "import resource, subprocess, sys\n"
        "r = subprocess.run(sys.argv[1:], stdin=subprocess.DEVNULL, capture_output=True)\n"
        "sys.stdout.buffer.write(r.stdout); sys.stderr.buffer.write(r.stderr)\n"
        "print('MAXRSS', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "
        "r.returncode, file=sys.stderr)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", wrapper, *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    line = [x for x in result.stderr.splitlines() if x.startswith("MAXRSS ")][-1]
    _, rss, code = line.split()
    return int(rss), subprocess.CompletedProcess(argv, int(code), result.stdout, result.stderr)


def test_a_large_project_deploys_in_bounded_client_memory(project: Project) -> None:
    # LAUNCHER_RSS_PROJECT_MB=1800 measures the 1.8 GB case (a few minutes).
    total = int(os.environ.get("LAUNCHER_RSS_PROJECT_MB", "300")) * 2**20
    src = make_big_tree(project.root / "big", total, 30)
    playbook: dict[str, Any] = book(project, src)
    playbook["project"]["keep_releases"] = 1
    project.write({NAME: (VMID, playbook)})
    rss, result = max_rss_kib(project.argv("deploy", "--restart", "--json"), timeout=1800)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    data = json.loads(result.stdout)
    info = release_info(data["results"][0] if "results" in data else data)
    assert info["sent_raw_bytes"] >= total
    assert info["sent_bytes"] > 16 * 2**20  # pushed in pieces, not inline
    print(f"client peak RSS {rss} KiB for a {total}-byte project")
    assert rss < 200 * 1024, f"client peak RSS {rss} KiB for a {total}-byte project"
    digest = hashlib.sha256((src / "data" / "shard007.bin").read_bytes()).hexdigest()
    assert ct_sha256(project, f"{WORKDIR}/current/data/shard007.bin") == digest
    leftovers = project.ct_text(VMID, "sh", "-c", f"ls -A {WORKDIR} | grep launcher- || true")
    assert leftovers.strip() == ""  # every pushed piece removed


def test_a_setup_may_take_its_own_timeout_beyond_the_command_timeout(project: Project) -> None:
    """The client waits for the setup's own limit on top of command_timeout, rather than
    giving up while the transaction goes on in the container."""
    src = make_package(project.root)
    setup = {"run": ["sleep 8; echo slow-setup-done"], "inputs": [], "timeout": 60}
    project.write(
        {NAME: (VMID, book(project, src, setup=setup))}, host=project.host(command_timeout=5)
    )
    result = project.launcher("deploy", "--restart")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "slow-setup-done" in result.stdout + result.stderr


def test_a_setup_longer_than_the_gpu_queries_timeout_still_deploys(project: Project) -> None:
    """nvidia-smi is asked when the transaction starts, and answers within 30 s of that: a
    release that takes longer to build asks again rather than failing the GPU check."""
    src = make_package(project.root)
    setup = {"run": ["sleep 32"], "inputs": [], "timeout": 120}
    project.write({NAME: (VMID, book(project, src, setup=setup))})
    result = project.launcher("deploy", "--restart", timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr


def test_logs_cut_an_endless_line(project: Project) -> None:
    """`logs` reads the log's end within what the asked lines can take; a 5 MB line comes
    back as its end, cut and marked, with the lines after it whole."""
    command = (
        "python3 -c \"import time; print('x' * 5000000); print('after-1'); print('after-2', "
        'flush=True); time.sleep(600)"'
    )
    book = project.playbook("longline", command=command)
    project.write({"longline": (VMID, book)})
    deployed = project.launcher("deploy", "--restart")
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    log = "/root/longline/.launcher/longline.log"
    project.wait_for(
        lambda: "after-2" in project.ct_text(VMID, "tail", "-c", "100", log), what="after-2"
    )
    result = project.launcher("logs", "--tail", "5")
    assert result.returncode == 0, result.stderr
    assert "[line cut: its start not read] xxx" in result.stdout
    assert "after-1" in result.stdout and "after-2" in result.stdout
    assert len(result.stdout) < 100_000
    project.kill_session(VMID, "longline")


def test_what_a_setup_leaves_running_ends_with_it(project: Project) -> None:
    """A process a setup command started in the background (its output elsewhere) could
    change the releases after they were checked: it is killed when the command ends."""
    src = make_package(project.root)
    marker = "launcher-setup-leftover"
    run = [f"python3 -c 'import time; time.sleep(600)  # {marker}' >/dev/null 2>&1 &"]
    project.write({NAME: (VMID, book(project, src, setup={"run": run, "inputs": []}))})
    result = project.launcher("deploy", "--restart")
    assert result.returncode == 0, result.stdout + result.stderr
    left = project.ct_text(VMID, "ps", "-eo", "args=")
    assert marker not in left, left
