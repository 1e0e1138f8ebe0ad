"""Redeploying without fear: what a run is told about itself, its overrides recorded, rollback
putting the last good run back (code, environment, checkpoints), a watcher restarting the same
run, and `deploy --verify --rollback-on-failure` doing all of it in one command."""

from __future__ import annotations

import json

import pytest

from launcher.protocol import RUN_ENV
from tests.e2e.project import Project

pytestmark = pytest.mark.e2e

VMID = 203

# Writes what the run was told about itself, then trains as the demo does.
ENV_DUMP = (
    "python3 -c 'import json, os, sys; json.dump({n: os.environ.get(n) for n in sys.argv[1:]}, "
    'open("run-env.json", "w"))\' ' + " ".join(RUN_ENV) + " && exec python3 train_demo.py"
)


def test_a_running_run_knows_its_id_release_workdir_and_checkpoints(project: Project) -> None:
    project.write({"told": (VMID, project.playbook("told", command=ENV_DUMP))})
    deployed = project.launcher("deploy", "--restart", "--json")
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    result = json.loads(deployed.stdout)
    project.wait_for(
        lambda: project.ct(VMID, "test", "-s", "/root/told/run-env.json").returncode == 0,
        what="the run's environment",
    )
    seen = json.loads(project.ct_text(VMID, "cat", "/root/told/run-env.json"))
    run = result["result"]["launched"]["run"]
    assert seen == {
        "LAUNCHER_RUN_ID": run.split(":", 1)[1],
        "LAUNCHER_RELEASE": result["sha256"],
        "LAUNCHER_WORKDIR": "/root/told",
        "LAUNCHER_CHECKPOINTS": "/root/told/checkpoints",
        "LAUNCHER_RESTART_COUNT": "0",
    }
    # The demo trainer writes its checkpoints where it was told.
    project.wait_for(
        lambda: project.ct(VMID, "sh", "-c", "ls /root/told/checkpoints/step_*.pt").returncode == 0,
        what="a checkpoint in $LAUNCHER_CHECKPOINTS",
    )
    project.kill_session(VMID, "told")
