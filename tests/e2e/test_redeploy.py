"""Redeploying without fear: what a run is told about itself, its overrides recorded, rollback
putting the last good run back (code, environment, checkpoints), a watcher restarting the same
run, and `deploy --verify --rollback-on-failure` doing all of it in one command."""

from __future__ import annotations

import json
import time

import pytest

from launcher.agent.protocol import RUN_ENV
from tests.e2e.project import Project
from tests.e2e.test_json_contract import document

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


def newest_step(project: Project, workdir: str) -> int:
    names = project.ct_text(VMID, "sh", "-c", f"ls {workdir}/checkpoints 2>/dev/null").split()
    steps = [int(n[5:-3]) for n in names if n.startswith("step_") and n.endswith(".pt")]
    return max(steps, default=0)


def inode(project: Project, path: str) -> int:
    return int(project.ct_text(VMID, "stat", "-c", "%i", path).strip())


def resumed_at(project: Project, session: str) -> list[int]:
    """The steps the session's runs resumed from, in the log's order."""
    log = project.ct_text(VMID, "cat", f"/root/{session}/.launcher/{session}.log")
    return [int(line.rsplit("step_", 1)[1][:-3]) for line in log.splitlines()
            if line.startswith("Resuming from ")]  # fmt: skip


def resuming_book(
    project: Project, name: str, env: dict[str, str] | None = None, **extra: object
) -> dict[str, object]:
    """A demo run that checkpoints every 2 steps and resumes from the newest checkpoint."""
    resume = {"DEMO_RESUME": "1", "DEMO_CHECKPOINT_EVERY": "2", **(env or {})}
    return project.playbook(name, env=resume, **extra)


def changed_script(project: Project, text: str) -> str:
    """A copy of the demo trainer with a line of its own (another sha256)."""
    from tests.e2e.project import DEMO_TRAINER

    path = project.root / f"train_demo_{abs(hash(text))}.py"
    path.write_text(DEMO_TRAINER.read_text() + f"\n# {text}\n")
    return str(path)


def test_rollback_puts_the_previous_run_back_with_its_checkpoints(project: Project) -> None:
    name, workdir = "back", "/root/back"
    book = resuming_book(project, name)
    project.write({name: (VMID, book)})
    first = project.launcher("deploy", "--restart", "--env", "DEMO_TAG=good")
    assert first.returncode == 0, first.stderr
    reached = project.wait_for(lambda: newest_step(project, workdir) >= 6, what="step 6")
    good_inode = inode(project, f"{workdir}/checkpoints")

    book["script"] = {"source": changed_script(project, "a new version"), "dest": "train_demo.py"}
    project.write({name: (VMID, book)})
    second = project.launcher("deploy", "--restart")
    assert second.returncode == 0, second.stderr
    project.wait_for(lambda: newest_step(project, workdir) >= 2, what="the new run's checkpoint")

    back = project.launcher("rollback", "--restart")
    assert back.returncode == 0, back.stdout + back.stderr
    assert "back in place" in back.stdout
    assert inode(project, f"{workdir}/checkpoints") == good_inode
    project.wait_for(lambda: len(resumed_at(project, name)) >= 1, what="a resume")
    assert resumed_at(project, name)[-1] >= reached
    run_file = project.ct_text(VMID, "cat", f"{workdir}/.launcher/{name}.run")
    assert "export DEMO_TAG=good" in run_file  # the put-back run's --env, not the playbook's

    records = json.loads(project.launcher("history", "--json").stdout)["records"]
    assert records[0]["rollback"] is True and records[0]["checkpoints"]["action"] == "restore"
    assert records[0]["checkpoints_now"] == {"state": "live", "path": f"{workdir}/checkpoints"}
    assert records[1]["checkpoints_now"]["state"] == "archived"  # the broken run's, its own
    assert records[2]["checkpoints_now"]["state"] == "restored"

    good, new = records[2]["run"], records[1]["run"]
    diffed = project.launcher("history", "--diff", good.split(":")[1][:20], new, "--json")
    assert diffed.returncode == 0, diffed.stdout + diffed.stderr
    diff = document(diffed, "history")["diff"]
    aspects = {change["aspect"]: change for change in diff["changes"]}
    assert aspects["code"]["from"] != aspects["code"]["to"]
    assert aspects["env removed"]["names"] == ["DEMO_TAG"] and diff["env_known"] is True
    assert aspects["overrides"]["from"] == "--env DEMO_TAG"
    assert "good" not in diffed.stdout  # names, never values
    shown = project.launcher("history", "--diff", good, new).stdout
    assert f"{good} -> {new}" in shown and "env removed  DEMO_TAG" in shown
    project.kill_session(VMID, name)


def test_a_watchers_restart_is_the_same_run_with_its_env_and_checkpoints(
    project: Project,
) -> None:
    from tests.e2e.test_watch import Watch, wait_until

    name, workdir = "wenv", "/root/wenv"
    book = resuming_book(project, name, verify={"wait": 2, "interval": 1})
    project.write({name: (VMID, book)})
    project.ct(VMID, "rm", "-rf", f"{workdir}/checkpoints")
    crash = ("--env", "DEMO_MODE=crash", "--env", "DEMO_CRASH_AFTER=8")
    deployed = project.launcher("deploy", "--restart", *crash, "-m", "crash sweep")
    assert deployed.returncode == 0, deployed.stderr
    watch = Watch(
        project, "-t", name, "--restart-on-failure", "--max-restarts", "1",
        "--restart-backoff", "0", "--for", "60",
    )  # fmt: skip

    def restarted() -> dict[str, object] | None:
        records = json.loads(project.launcher("history", "--json").stdout)["records"]
        return records[0] if records[0].get("restarted_by") else None

    try:
        wait_until(restarted, 40, "the watcher's restart", watch)
        wait_until(lambda: resumed_at(project, name), 15, "the restarted run's resume", watch)
    finally:
        watch.kill()
    record = restarted()
    assert record is not None
    assert record["restarted_by"] == "watch (1/1)"
    assert record["checkpoints"]["action"] == "keep"  # never archived
    assert record["overrides"]["env"] == ["DEMO_CRASH_AFTER", "DEMO_MODE"]
    assert "rollback" not in record
    run_file = project.ct_text(VMID, "cat", f"{workdir}/.launcher/{name}.run")
    assert "export DEMO_MODE=crash" in run_file  # the crashed run's --env, kept
    assert "export LAUNCHER_RESTART_COUNT=1" in run_file
    assert resumed_at(project, name)[0] > 0
    shown = project.launcher("history", "--limit", "1").stdout
    assert "[restarted by watch (1/1)]" in shown and "--env DEMO_MODE" in shown
    project.kill_session(VMID, name)


def broken_script(project: Project) -> str:
    """The demo trainer with a fix that breaks it: it dies at start with a traceback."""
    from tests.e2e.project import DEMO_TRAINER

    path = project.root / "train_demo_broken.py"
    path.write_text("raise RuntimeError('the 2 a.m. fix')\n" + DEMO_TRAINER.read_text())
    return str(path)


def sha_in(project: Project, path: str) -> str:
    return project.ct_text(VMID, "sha256sum", path).split()[0]


def test_the_2am_case_a_broken_fix_puts_the_healthy_run_back(project: Project) -> None:
    name, workdir = "twoam", "/root/twoam"
    book = resuming_book(project, name)
    project.write({name: (VMID, book)})
    project.ct(VMID, "rm", "-rf", workdir)
    first = project.launcher("deploy", "--restart", "--env", "DEMO_TAG=good")
    assert first.returncode == 0, first.stderr
    good_sha = sha_in(project, f"{workdir}/train_demo.py")
    reached = project.wait_for(lambda: newest_step(project, workdir) >= 6, what="step 6")
    good_inode = inode(project, f"{workdir}/checkpoints")

    book["script"] = {"source": broken_script(project), "dest": "train_demo.py"}
    project.write({name: (VMID, book)})
    started = time.monotonic()
    fixed = project.launcher(
        "deploy", "--restart", "--verify", "--rollback-on-failure", "--env", "DEMO_TAG=broken",
        "-m", "the 2 a.m. fix", "--json",
    )  # fmt: skip
    took = time.monotonic() - started
    assert fixed.returncode == 5, fixed.stdout + fixed.stderr
    result = document(fixed, "deploy")
    assert result["outcome"] == "rolled_back" and result["exit_code"] == 5
    assert result["verify"]["verdict"] == "unhealthy"
    assert result["rollback_verify"]["verdict"] == "healthy"
    assert result["rollback"]["result"]["checkpoints"]["action"] == "restore"
    names = [s["name"] for s in result["steps"]]
    assert names.index("launch") < names.index("rollback") < len(names) - 1
    print(f"2 a.m. case: broken deploy, probe, rollback and probe took {took:.1f} s")

    assert sha_in(project, f"{workdir}/train_demo.py") == good_sha  # the old code
    assert inode(project, f"{workdir}/checkpoints") == good_inode  # its checkpoints, moved back
    run_file = project.ct_text(VMID, "cat", f"{workdir}/.launcher/{name}.run")
    assert "export DEMO_TAG=good" in run_file  # its env, not the fix's
    project.wait_for(lambda: resumed_at(project, name), what="the old run's resume")
    assert resumed_at(project, name)[-1] >= reached
    status = project.launcher("status")
    assert status.returncode == 0, status.stdout
    assert "overrides: --env DEMO_TAG" in status.stdout  # the put-back run's, shown as such

    records = json.loads(project.launcher("history", "--json").stdout)["records"]
    back, broken, good = records[0], records[1], records[2]
    assert back["rollback"] is True and back["rolled_back_to"] == good["run"]
    assert back["rollback_reason"].startswith(f"run {broken['run']} failed its startup probe")
    assert broken["overrides"]["message"] == "the 2 a.m. fix"
    assert good["checkpoints_now"]["state"] == "restored"
    assert broken["checkpoints_now"]["state"] in ("archived", "none")
    shown = project.launcher("history", "--limit", "1").stdout
    assert "[rollback]" in shown and "failed its startup probe" in shown
    project.kill_session(VMID, name)


def test_a_broken_fix_over_a_run_that_is_broken_too(project: Project) -> None:
    name, workdir = "bothbad", "/root/bothbad"
    book = resuming_book(project, name, env={"DEMO_MODE": "crash", "DEMO_CRASH_AFTER": "3"})
    project.write({name: (VMID, book)})
    project.ct(VMID, "rm", "-rf", workdir)
    assert project.launcher("deploy", "--restart").returncode == 0
    book["script"] = {"source": broken_script(project), "dest": "train_demo.py"}
    project.write({name: (VMID, book)})
    fixed = project.launcher("deploy", "--restart", "--verify", "--rollback-on-failure")
    assert fixed.returncode == 6, fixed.stdout + fixed.stderr
    assert "rolled back to" in fixed.stdout and "not healthy either" in fixed.stdout
    records = json.loads(project.launcher("history", "--json").stdout)["records"]
    assert records[0]["rollback"] is True
    project.kill_session(VMID, name)


def test_a_rollback_that_would_be_impossible_is_refused_before_the_stop(project: Project) -> None:
    name, workdir = "norb", "/root/norb"
    book = resuming_book(project, name)
    project.write({name: (VMID, book)})
    project.ct(VMID, "rm", "-rf", workdir)
    # A first deploy: no run to go back to.
    fresh = project.launcher("deploy", "--restart", "--verify", "--rollback-on-failure")
    assert fresh.returncode == 4, fresh.stdout + fresh.stderr
    assert "rollback impossible: no previous run" in fresh.stderr
    assert project.ct(VMID, "test", "-e", f"{workdir}/train_demo.py").returncode != 0

    assert project.launcher("deploy", "--restart").returncode == 0
    project.wait_for(lambda: project.processes(VMID, "train_demo.py"), what="the run")
    pane = project.ct_text(VMID, "tmux", "display-message", "-p", "-t", f"={name}:", "#{pane_pid}")
    book["script"] = {"source": broken_script(project), "dest": "train_demo.py"}
    project.write({name: (VMID, book)})
    purge = project.launcher(
        "deploy", "--restart", "--verify", "--rollback-on-failure", "--purge-checkpoints"
    )
    assert purge.returncode == 4, purge.stdout + purge.stderr
    assert "rollback impossible: --purge-checkpoints deletes the checkpoints" in purge.stderr
    after = project.ct_text(VMID, "tmux", "display-message", "-p", "-t", f"={name}:", "#{pane_pid}")
    assert after == pane  # nothing was stopped
    assert "the 2 a.m. fix" not in project.ct_text(VMID, "cat", f"{workdir}/train_demo.py")
    project.kill_session(VMID, name)


def test_smoke_rolls_back_too(project: Project) -> None:
    name, workdir = "smokeback", "/root/smokeback"
    book = resuming_book(project, name)
    project.write({name: (VMID, book)})
    project.ct(VMID, "rm", "-rf", workdir)
    assert project.launcher("deploy", "--restart").returncode == 0
    good_sha = sha_in(project, f"{workdir}/train_demo.py")
    project.wait_for(lambda: newest_step(project, workdir) >= 2, what="a checkpoint")
    book["script"] = {"source": broken_script(project), "dest": "train_demo.py"}
    project.write({name: (VMID, book)})
    smoke = project.launcher("smoke", "--rollback-on-failure", "--json")
    assert smoke.returncode == 5, smoke.stdout + smoke.stderr
    smoked = document(smoke, "smoke")
    assert smoked["outcome"] == "rolled_back"
    assert smoked["verify"]["verdict"] == "unhealthy"
    assert smoked["rollback_verify"]["verdict"] == "healthy"
    assert sha_in(project, f"{workdir}/train_demo.py") == good_sha
    project.kill_session(VMID, name)


def test_a_watcher_leaves_a_failed_verified_deploy_to_its_rollback(project: Project) -> None:
    """One story: a watcher with --restart-on-failure does not restart the new run that a
    deploy --rollback-on-failure is judging; that deploy puts the previous run back."""
    from tests.e2e.test_watch import Watch, wait_until

    name, workdir = "onestory", "/root/onestory"
    book = resuming_book(project, name, verify={"wait": 2, "interval": 1})
    project.write({name: (VMID, book)})
    project.ct(VMID, "rm", "-rf", workdir)
    assert project.launcher("deploy", "--restart").returncode == 0
    watch = Watch(
        project, "-t", name, "--restart-on-failure", "--restart-backoff", "0", "--for", "60"
    )
    try:
        wait_until(lambda: "healthy" in watch.stderr(), 30, "the watcher's healthy", watch)
        # The fix crashes at once; the deploy's probe polls every 8 s: the watcher (every 1 s)
        # sees the crash first, and must leave it to the deploy.
        crash = ("--env", "DEMO_MODE=crash", "--env", "DEMO_CRASH_AFTER=1")
        crash += ("--set", "verify.interval=8")
        fixed = project.launcher("deploy", "--restart", "--verify", "--rollback-on-failure", *crash)
        assert fixed.returncode == 5, fixed.stdout + fixed.stderr
        time.sleep(3)  # the watcher's polls of the run put back
        seen = watch.stderr()
    finally:
        watch.kill()
    # The deploy's probe may put the previous run back before a watcher's poll sees the crash
    # (a dead pane fails the probe at once); when the watcher saw it, it said whose call it is.
    if "unhealthy" in seen:
        assert "not restarted: its deploy (--rollback-on-failure) decides" in seen, seen
    assert "restarting" not in seen, seen
    records = json.loads(project.launcher("history", "--json").stdout)["records"]
    assert not any(r.get("restarted_by") for r in records), records[0]
    assert records[0]["rollback"] is True
    assert "DEMO_MODE=crash" not in project.ct_text(VMID, "cat", f"{workdir}/.launcher/{name}.run")
    project.kill_session(VMID, name)


def test_a_broken_release_puts_the_previous_release_back(project: Project) -> None:
    from tests.e2e.test_releases import make_package

    name, workdir = "pkgback", "/root/pkgback"
    src = make_package(project.root)
    book = resuming_book(project, name, command="python3 -m trainer")
    del book["script"]
    book["project"] = {"source": str(src), "keep_releases": 3}
    project.write({name: (VMID, book)})
    project.ct(VMID, "rm", "-rf", workdir)
    first = project.launcher("deploy", "--restart", "--json")
    assert first.returncode == 0, first.stderr
    good = json.loads(first.stdout)["result"]["release"]["id"]
    project.wait_for(lambda: newest_step(project, workdir) >= 4, what="step 4")
    good_inode = inode(project, f"{workdir}/checkpoints")

    (src / "trainer" / "__main__.py").write_text("raise SystemExit('the broken release')\n")
    fixed = project.launcher("deploy", "--restart", "--verify", "--rollback-on-failure", "--json")
    assert fixed.returncode == 5, fixed.stdout + fixed.stderr
    result = document(fixed, "deploy")
    assert result["rollback"]["result"]["release"]["id"] == good
    assert project.ct_text(VMID, "readlink", f"{workdir}/current").strip() == f"releases/{good}"
    assert inode(project, f"{workdir}/checkpoints") == good_inode
    run_file = project.ct_text(VMID, "cat", f"{workdir}/.launcher/{name}.run")
    assert f"export LAUNCHER_RELEASE={good}" in run_file
    project.kill_session(VMID, name)
