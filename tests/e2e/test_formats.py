"""`launcher verify` on trainers that print other formats: a Hugging Face Trainer-style run
(dict lines above a tqdm bar) and a JSON-lines run, healthy and diverging, on the sandbox."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.e2e.project import Project, verify_json

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
