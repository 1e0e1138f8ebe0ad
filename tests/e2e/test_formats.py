"""`launcher verify` on trainers that print other formats: a Hugging Face Trainer-style run
(dict lines above a tqdm bar) and a JSON-lines run, healthy and diverging, on the sandbox; and a
trainer of its own shape (`key value | key value`): its lines found by `status-format detect`,
checked by `status-format test`, HEALTHY; unread lines failing in the warmup with the block."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.project import DEMO_TRAINER, Project, verify_json

pytestmark = pytest.mark.e2e

VMID = 201

# The demo trainer's hf format: loss from the dict lines, step and it/s from the bar (about 2
# it/s once warm), so the throughput floor is in it/s and there are no queues to check.
HF: dict[str, Any] = {
    "env": {"DEMO_FORMAT": "hf"},
    "status": {"preset": "hf-trainer"},
    "verify": {"queues": {}, "throughput": {"min": 0.5}},
}
# The jsonl format: nested throughput and queues, mapped to the checked names.
JSONL: dict[str, Any] = {
    "env": {"DEMO_FORMAT": "jsonl"},
    "status": {
        "format": "json",
        "fields": {
            "throughput": "throughput.tokens_per_s",
            "throughput_unit": "tok/s",
            "elapsed": "elapsed_s",
            "queues": {"q_pre": "queues.q_pre", "q_hs": "queues.q_hs"},
        },
    },
}


def deploy(project: Project, name: str, setup: dict[str, Any], **env: str) -> None:
    book = project.playbook(
        name,
        env={**setup["env"], **env},
        status=setup["status"],
        verify=dict(setup.get("verify", {})),
    )
    project.write({name: (VMID, book)})
    result = project.launcher("deploy", "--restart")
    assert result.returncode == 0, result.stdout + result.stderr


def verify(project: Project, *args: str) -> tuple[int, dict[str, Any], float]:
    return verify_json(project, *args)


def failed(report: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["observed"] for c in report["checks"] if c["verdict"] == "fail"}


def test_hugging_face_trainer_run_is_healthy(project: Project) -> None:
    deploy(project, "hfok", HF)
    code, report, _ = verify(project)
    assert code == 0, report
    assert report["verdict"] == "healthy"
    samples = report["samples"]
    losses = [s["loss"] for s in samples if s["loss"] is not None]
    steps = [s["step"] for s in samples if s["step"] is not None]
    rates = [s["throughput"] for s in samples if s["throughput"] is not None]
    # The dicts give the loss, the bar (one at the bottom of the pane) the step and it/s.
    assert len(losses) >= 3 and all(math.isfinite(v) for v in losses)
    assert steps and steps[-1] > 0
    assert rates and 0.5 < rates[-1] < 10
    project.kill_session(VMID, "hfok")


def test_json_lines_run_is_healthy(project: Project) -> None:
    deploy(project, "jsonok", JSONL)
    code, report, _ = verify(project)
    assert code == 0, report
    latest = report["samples"][-1]
    assert latest["throughput"] > 1000  # tokens/s, from the nested field
    assert latest["queues"]["q_pre"] is not None and len(latest["queues"]["q_pre"]) == 6
    assert latest["queues"]["q_hs"] is not None and len(latest["queues"]["q_hs"]) == 1
    assert latest["elapsed_min"] is not None and latest["elapsed_min"] > 0
    steps = [s["step"] for s in report["samples"]]
    assert steps == sorted(steps) and steps[-1] > 0
    project.kill_session(VMID, "jsonok")


@pytest.mark.parametrize(("name", "setup"), [("hfnan", HF), ("jsonnan", JSONL)])
def test_diverging_run_is_unhealthy(project: Project, name: str, setup: dict[str, Any]) -> None:
    """The loss becomes nan two seconds in (`{'loss': nan, ...}` / `"loss": NaN`)."""
    deploy(project, name, setup, DEMO_MODE="nan", DEMO_NAN_AFTER="2")
    code, report, elapsed = verify(project)
    assert code == 1, report
    assert report["verdict"] == "unhealthy"
    assert "nan" in failed(report).get("loss", ""), report["checks"]
    assert elapsed < 60
    project.kill_session(VMID, name)


# --- a trainer of its own shape (the demo trainer's pipes format) ----------------------------

# `step 317 | loss 2.04 | tok/s 50676 | q_pre 13/16 | q_post 3/16`, a line each 0.5 s.
PIPES_ENV = {"DEMO_FORMAT": "pipes"}
BLOCK = "`status: {format: keyvalue, fields: {throughput: tok/s, throughput_unit: tok/s}}`"


def test_lines_of_another_shape_fail_in_the_warmup_with_the_block_that_reads_them(
    project: Project,
) -> None:
    """The README's playbook (no `status:`) on a trainer that prints another shape: before,
    "no status lines yet" until the window ended; now the warmup says why and the first
    judged poll fails, quoting the lines and the block that reads them."""
    wait, interval = 6.0, 2.0
    book = project.playbook(
        "unread", env=PIPES_ENV, verify={"wait": wait, "interval": interval, "window": 120}
    )
    project.write({"unread": (VMID, book)})
    assert project.launcher("deploy", "--restart").returncode == 0
    result = project.launcher("verify", "--json", timeout=90)
    report = json.loads(result.stdout)
    assert result.returncode == 1, report
    assert report["timings"]["duration"] <= wait + 2 * interval, report["timings"]
    reason = report["reason"]
    assert reason.startswith("samples: no status line in ") and BLOCK in reason, reason
    assert re.search(r"`step \d+ \| loss [\d.]+ \| tok/s \d+ \| q_pre \d+/16 \| q_post", reason)
    # Said during the warmup, once, with the block as YAML to paste.
    note = "the trainer's lines are not read: no status line in "
    assert result.stderr.count(note) == 1, result.stderr
    assert "status:\n  format: keyvalue\n  fields:\n    throughput: tok/s\n" in result.stderr
    warmup = result.stderr[: result.stderr.index(note)]
    assert "judging" not in warmup, result.stderr
    project.kill_session(VMID, "unread")


def test_a_trainer_of_its_own_shape_from_detect_to_healthy(
    project: Project, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    """A newcomer's loop with their own trainer: deploy it with the README's playbook, detect
    the block from its live pane, test the block on a sample, deploy again, verify HEALTHY
    within one window. Each step is timed in the test's log."""
    started = time.monotonic()
    times: dict[str, float] = {}
    book = project.playbook("own", env=PIPES_ENV)
    project.write({"own": (VMID, book)})
    assert project.launcher("deploy", "--restart").returncode == 0
    project.wait_for(
        lambda: project.launcher("logs", "--raw", "-t", "own").stdout.count("q_pre") >= 3,
        timeout=30,
        what="three status lines in the pane",
    )
    times["deployed"] = time.monotonic() - started

    detected = project.launcher("status-format", "detect", "-t", "own")
    assert detected.returncode == 0, detected.stderr
    assert detected.stdout == (
        "status:\n  format: keyvalue\n  fields:\n    throughput: tok/s\n"
        "    throughput_unit: tok/s\n"
    ), detected.stdout
    assert "read as keyvalue lines: step, loss, throughput" in detected.stderr
    book["status"] = yaml.safe_load(detected.stdout)["status"]
    project.write({"own": (VMID, book)})
    times["detected"] = time.monotonic() - started

    sample = tmp_path / "sample.log"
    sample.write_text(project.launcher("logs", "--tail", "20", "-t", "own").stdout)
    playbook = project.root / "playbooks" / "own.yaml"
    with sample.open("rb") as stdin:
        tested = subprocess.run(
            project.argv("status-format", "test", str(playbook)),
            stdin=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert re.search(
        r"→  step=\d+  loss=[\d.]+  throughput=\d+ tok/s  q_pre=\d+% full", tested.stdout
    )
    assert "read as status lines: step in" in tested.stderr
    times["tested"] = time.monotonic() - started

    assert project.launcher("deploy", "--restart").returncode == 0
    code, report, elapsed = verify_json(project)
    assert code == 0, report
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["queues.q_pre"]["verdict"] == "pass"  # a fill: `13/16`
    assert checks["queues.q_pre"]["observed"].endswith("% full")
    assert checks["queues.q_hs"]["verdict"] == "skip"  # the trainer prints none
    assert checks["throughput"]["verdict"] == "pass"
    window = book["verify"]["wait"] + book["verify"]["window"]
    assert elapsed < window
    times["healthy"] = time.monotonic() - started
    for name, value in times.items():
        record_property(f"seconds_to_{name}", round(value, 1))
    print("newcomer with an own trainer, seconds since start:", times)
    project.kill_session(VMID, "own")


ROOT = Path(__file__).resolve().parents[2]


def readme_another_trainer_commands() -> list[str]:
    """The README's "Another trainer?" console block, its `$ ` lines without the prompt."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    after = text[text.index("**Another trainer?**") :]
    start = after.index("```console\n") + len("```console\n")
    block = after[start : after.index("\n```", start)]
    return [line[2:] for line in block.splitlines() if line.startswith("$ ")]


def test_readme_another_trainer_steps_run_verbatim_to_healthy(
    project: Project, record_property: Callable[[str, object], None]
) -> None:
    """The README's steps for a trainer that is not DFlash, typed as they are written in the
    project's directory (train.py: the demo trainer printing its pipes format), then deploy and
    verify: HEALTHY, timed from nothing."""
    started = time.monotonic()
    commands = readme_another_trainer_commands()
    assert any("status-format detect" in c for c in commands), commands
    book = project.playbook("dflash", env=PIPES_ENV)
    project.write({"dflash": (VMID, book)})
    (project.root / "train.py").write_bytes(DEMO_TRAINER.read_bytes())
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "DEMO_FORMAT": "pipes",
        "DEMO_INTERVAL": "0.05",  # the sample's 200 lines in 10 s
        "DEMO_RAMP": "1",
        "DEMO_GPUS": "0",
    }
    env.pop("LAUNCHER_INVENTORY", None)  # ./inventory.yaml, as a newcomer's directory has
    script = "set -eu\n" + "".join(f"echo '+ {c}'\n{c}\n" for c in commands)
    result = subprocess.run(
        ["bash", "-c", script],
        cwd=project.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "→  step=" in result.stdout and "% full" in result.stdout, result.stdout
    written = yaml.safe_load((project.root / "playbooks" / "dflash.yaml").read_text())
    assert written["status"] == {
        "format": "keyvalue",
        "fields": {"throughput": "tok/s", "throughput_unit": "tok/s"},
    }
    detected = time.monotonic() - started
    assert project.launcher("deploy", "--restart").returncode == 0
    code, report, _ = verify_json(project)
    assert code == 0, report
    healthy = time.monotonic() - started
    record_property("seconds_to_status_block", round(detected, 1))
    record_property("seconds_to_healthy", round(healthy, 1))
    print(f"README's another-trainer steps: block in {detected:.0f} s, HEALTHY in {healthy:.0f} s")
    assert healthy < 600  # the ten minutes, with room to spare
    project.kill_session(VMID, "dflash")
