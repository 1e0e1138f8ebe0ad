"""Redeploy of a project (2,000 files, 50 MB) in which one file changed.

launcher: `deploy --restart` of a `project:` playbook (the second deploy: one file changed); the
bytes are what its JSON report says were sent (the compressed stream of missing files).
A: `rsync -az` of the same tree to a directory on the host (its own "Total bytes sent" +
"Total bytes received" from --stats), then the hand-written ssh redeploy (bench/handwritten.sh)
for the stop and launch. rsync lands on the host, not in the container: a real setup would
still have to get the files into the CT (pct push each, or rsync into its mounted rootfs), so A
is a lower bound on what the hand-written way costs.
"""

from __future__ import annotations

import json
import os
import random
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from harness import DEMO_TRAINER, DEPLOY_VMID, HAND_VMID, WORKDIR, BenchEnv, check
from rows import Row, median

FILES = 2000
TOTAL = 50 * 2**20


def make_project(root: Path) -> Path:
    """2,000 files, 50 MB: a package with a module that runs the demo trainer, and data."""
    rng = random.Random(27)
    (root / "trainer" / "data").mkdir(parents=True, exist_ok=True)
    (root / "trainer" / "__init__.py").write_text("")
    (root / "trainer" / "demo.py").write_text(DEMO_TRAINER.read_text())
    (root / "trainer" / "__main__.py").write_text(
        "import runpy\nrunpy.run_module('trainer.demo', run_name='__main__')\n"
    )
    (root / "config.json").write_text(json.dumps({"version": 0}))
    each = TOTAL // FILES
    for i in range(FILES - 4):
        (root / "trainer" / "data" / f"shard{i:04}.bin").write_bytes(rng.randbytes(each))
    return root


def project_rows(env: BenchEnv, runs: int, log: Callable[[str], None]) -> list[Row]:
    src = make_project(env.tmp / "pkg")
    book: dict[str, Any] = yaml.safe_load((env.project / env.playbook("pkgbase")).read_text())
    del book["script"]
    book.update(
        {"name": "pkg", "session": "pkg", "workdir": "/root/pkg", "command": "python3 -m trainer",
         "project": {"source": str(src), "keep_releases": 2}}
    )  # fmt: skip
    (env.project / "playbooks" / "pkg.yaml").write_text(yaml.safe_dump(book, sort_keys=False))
    inventory = env.inventory("inventory-pkg", {"pkg": (DEPLOY_VMID, "playbooks/pkg.yaml")})
    log("project: first deploy (every file sent)")
    check(env.launcher(inventory, "deploy", "--restart", timeout=600), "first project deploy")
    stage = f"/tmp/launcher-bench-rsync-{os.getpid()}/"
    ssh = shlex.join(env.ssh_argv()[:-1])  # the options, without user@host
    assert env.info is not None
    rsync = ["rsync", "-az", "--stats", "-e", ssh, f"{src}/",
             f"{env.info.user}@{env.info.address}:{stage}"]  # fmt: skip
    log("project: first rsync -az to the host")
    check(env.run(rsync, timeout=600), "first rsync")
    mkdir = ["pct", "exec", str(HAND_VMID), "--", "mkdir", "-p", WORKDIR]
    check(env.run(env.ssh_argv(*mkdir)), "the hand-written redeploy's workdir")
    lau_s: list[float] = []
    lau_b: list[int] = []
    hand_s: list[float] = []
    hand_b: list[int] = []
    for n in range(1, runs + 1):
        log(f"project: redeploy {n} of {runs}")
        (src / "config.json").write_text(json.dumps({"version": n}))
        result = check(env.launcher(inventory, "deploy", "--restart", "--json"), "redeploy")
        report = json.loads(result.out)
        report = report["results"][0] if "results" in report else report
        lau_s.append(result.seconds)
        lau_b.append(int(report["result"]["release"]["sent_bytes"]))
        synced = check(env.run(rsync, timeout=600), "rsync")
        hand = check(env.run(env.handwritten_argv(HAND_VMID, mux=False)), "handwritten")
        hand_s.append(synced.seconds + hand.seconds)
        hand_b.append(_rsync_bytes(synced.out))
    env.run(env.ssh_argv("rm", "-rf", stage))
    note = (
        f"{FILES} files, {TOTAL // 2**20} MB, 1 changed; median of {runs}; "
        "A: rsync -az to the host + handwritten.sh"
    )
    return [
        Row("project redeploy, 1 of 2,000 files changed", "s", median(lau_s), median(hand_s),
            ratio=median(lau_s) / median(hand_s), note=note),
        Row("project redeploy: bytes sent", "bytes", median(lau_b), median(hand_b),
            ratio=median(lau_b) / max(median(hand_b), 1),
            note="launcher: the gzip stream of missing files; A: rsync's sent + received"),
    ]  # fmt: skip


def _rsync_bytes(stats: str) -> int:
    total = 0
    for key in ("Total bytes sent", "Total bytes received"):
        match = re.search(rf"{key}: ([\d,]+)", stats)
        total += int(match.group(1).replace(",", "")) if match else 0
    return total
