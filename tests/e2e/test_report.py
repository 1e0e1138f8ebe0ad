"""`verify --report` and `smoke --report` end to end: the HTML page of a real run, read back.

The run prints hostile text before its status lines (markup and a terminal escape); the page
must show it as text. The page is parsed as a browser tokenises it (html.parser).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from launcher import __version__
from tests.e2e.project import DEMO_TRAINER, Project
from tests.unit.test_htmlreport import header_of, parse

pytestmark = pytest.mark.e2e

VMID = 202
TRAINER_SHA256 = hashlib.sha256(DEMO_TRAINER.read_bytes()).hexdigest()
HOSTILE = "<script>alert(1)</script><img src=http://x.invalid/a.png>"
# printf's own escapes: an OSC title sequence, then the markup, then the trainer.
COMMAND = r"printf '\033]0;pwned\007%s\n' '" + HOSTILE + "'; exec python3 train_demo.py"


def assert_self_contained(page_text: str) -> None:
    page = parse(page_text)
    assert not page.all("script") and not page.all("img") and not page.all("link")
    for _, attrs in page.tags:
        for name, value in attrs.items():
            assert name not in ("src", "href"), (name, value)
            assert name == "xmlns" or "://" not in (value or ""), (name, value)


def assert_header(page_text: str, target: str, sha256: str) -> None:
    """The header names what was judged: target, host, CT, run, the deployed script, version."""
    header = header_of(page_text)
    assert header["target"] == target
    assert header["host"] == "sandbox" and header["CT"] == str(VMID)
    assert header["run"].startswith(f"{target}:"), header
    assert header["script sha256"] == sha256
    assert header["deployed"].endswith("Z") and header["launcher"] == __version__
    assert header["report written"].endswith(" UTC")


def test_verify_report_of_a_healthy_run(project: Project, tmp_path: Path) -> None:
    project.write({"report": (VMID, project.playbook("report", command=COMMAND))})
    deployed = project.launcher("deploy", "--restart")
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    html = tmp_path / "verify.html"
    result = project.launcher("verify", "--report", str(html), timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    text = html.read_text(encoding="utf-8")
    assert_self_contained(text)
    assert_header(text, "report", TRAINER_SHA256)
    page = parse(text)
    charts = [a.get("aria-label") for a in page.all("svg")]
    assert charts[:3] == ["throughput (Ktok/s)", "loss", "step rate (steps/s)"]
    assert "queue q_pre depth" in charts and "queue q_hs depth" in charts
    lines = [a["points"] or "" for a in page.all("polyline")]
    assert len(lines) >= 3 + 6 + 1 and all(len(p.split()) >= 3 for p in lines)
    assert any(a.get("class") == "warmup" for a in page.all("line"))
    assert {"alive", "fatal", "throughput", "step", "loss"} <= set(page.cells)
    assert HOSTILE in page.pre and "pwned" not in page.pre and "\x1b" not in page.pre
    assert "step=" in page.pre  # the trainer's own status lines
    project.kill_session(VMID, "report")


def test_smoke_report_of_a_crash(project: Project, tmp_path: Path) -> None:
    book = project.playbook("crash", env={"DEMO_MODE": "crash", "DEMO_CRASH_AFTER": "3"})
    project.write({"crash": (VMID, book)})
    html = tmp_path / "smoke.html"
    result = project.launcher("smoke", "--wait", "30", "--report", str(html), timeout=90)
    assert result.returncode == 1, result.stdout + result.stderr
    text = html.read_text(encoding="utf-8")
    assert_self_contained(text)
    assert_header(text, "crash", TRAINER_SHA256)
    assert text.index("Why it failed") < text.index("<svg")
    page = parse(text)
    assert "FAILED" in text and page.all("svg")  # the state of a run that crashed
    assert "Traceback (most recent call last):" in page.pre
    assert "NCCL error" in page.pre
    failing = [c for c in page.cells if c in ("alive", "fatal")]
    assert failing, page.cells
    keep = os.environ.get("LAUNCHER_KEEP_REPORT")  # scripts/screenshot-report.sh reads it
    if keep:
        shutil.copy(html, keep)
    project.kill_session(VMID, "crash")


def test_report_to_an_unwritable_place_is_a_usage_error(project: Project) -> None:
    project.write({"report": (VMID, project.playbook("report"))})
    result = project.launcher("verify", "--report", "/nonexistent-dir/verify.html")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--report" in result.stderr
