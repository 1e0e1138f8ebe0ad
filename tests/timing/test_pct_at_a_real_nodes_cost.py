"""Deploy, verify, status and stop keep their deadlines when every `pct` call costs what it
does on a real Proxmox node. The node's other quirks: tests/e2e/test_proxmox_node.py."""

from __future__ import annotations

import time

from tests.e2e.project import Project, verify_json
from tests.e2e.test_proxmox_node import big_script, fresh, ok

# Real pct is a Perl program that loads the PVE modules before it does anything: a few hundred
# ms a call. The stand-in's latency fault makes each call cost that, so the deadlines these
# commands use are tried at a real node's pace.
PCT_COST = 0.4
SLOW_CT = 201
WAIT, INTERVAL, THRESHOLD = 3.0, 1.0, 3


def slow_project(project: Project, name: str, **overrides: object) -> None:
    verify = {"wait": WAIT, "interval": INTERVAL, "failure_threshold": THRESHOLD, "window": 20}
    book = project.playbook(name, verify=verify, **overrides)
    project.write({name: (SLOW_CT, book)})
    project.sandbox.set_faults(pct_latency=PCT_COST)


def test_deploy_verify_status_stop_at_a_real_nodes_pct_cost(project: Project) -> None:
    name = fresh("slow")
    slow_project(project, name)
    calls = project.sandbox.pct_calls()
    started = time.monotonic()
    ok(project.launcher("deploy", "--restart"))
    deployed = time.monotonic() - started
    assert project.sandbox.pct_calls() - calls == 1 and deployed < PCT_COST + 8, deployed

    code, report, elapsed = verify_json(project)
    assert code == 0, report["reason"]
    assert elapsed < WAIT + 20 + 2 * 4, elapsed  # within its window, polls at a real cost

    started = time.monotonic()
    status = project.launcher("status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert time.monotonic() - started < PCT_COST + 6

    started = time.monotonic()
    ok(project.launcher("stop"))
    assert time.monotonic() - started < PCT_COST + 3 + 8  # the playbook's grace, then a kill
    assert not project.processes(SLOW_CT, "train_demo.py")


def test_a_crash_fails_verify_within_its_threshold_at_a_real_nodes_pct_cost(
    project: Project,
) -> None:
    name = fresh("slowcrash")
    slow_project(project, name, env={"DEMO_MODE": "crash", "DEMO_CRASH_AFTER": "2"})
    ok(project.launcher("deploy", "--restart"))
    code, report, _ = verify_json(project)
    assert code == 1, report
    # Each poll costs a pct call more than on the suite's instant stand-in: the threshold's
    # polls still end it within wait + threshold x (interval + that cost) + the usual slack.
    duration = report["timings"]["duration"]
    assert duration < WAIT + THRESHOLD * (INTERVAL + PCT_COST) + 4, (duration, report["reason"])


def test_first_deploy_of_a_6mib_script_at_a_real_nodes_pct_cost(project: Project) -> None:
    """Four pct calls (workdir, push, its check, the transaction), each at a real node's cost:
    within the node's default command deadline."""
    name = fresh("slowbig")
    slow_project(project, name)
    book = project.playbook(name)
    book["script"]["source"] = str(big_script(project, name))
    project.write({name: (SLOW_CT, book)})
    calls = project.sandbox.pct_calls()
    started = time.monotonic()
    ok(project.launcher("deploy", "--restart"))
    assert project.sandbox.pct_calls() - calls == 4
    assert time.monotonic() - started < 4 * PCT_COST + 10
