"""The deploy sequence against a strict fake host: order of calls, and what stops it early."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from launcher.deploy import DeployOptions, Step, deploy
from launcher.errors import ContainerError, ExitCode, LauncherError
from tests.unit.fakehost import StrictFakeHost
from tests.unit.projectfiles import SCRIPT, load_target

SHA = hashlib.sha256(SCRIPT).hexdigest()


def preflight(**overrides: Any) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "python": "3.11.2",
        "tmux": "tmux 3.3a",
        "workdir": {"exists": True, "writable": True, "created": False},
        "free_bytes": 10 * 2**30,
        "gpus": {"visible": 8, "names": [], "error": None, "holders": []},
        "session": {"exists": False, "pane_dead": None, "dead_status": None, "pane_pid": None},
        "dest_sha256": None,
        "checkpoints": {"path": "/root/dflash/checkpoints", "exists": True, "unsafe": None},
        "lock": None,
    }
    answer.update(overrides)
    return answer


APPLIED = {
    "steps": [
        {"name": "lock", "status": "ok", "detail": "taken"},
        {"name": "install", "status": "ok", "detail": "mv into place"},
        {"name": "launch", "status": "ok", "detail": "session dflash"},
    ],
    "record": {"time": "now"},
}


@pytest.fixture(autouse=True)
def _state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def run_deploy(tmp_path: Path, host: StrictFakeHost, **options: Any) -> tuple[list[Step], Any]:
    steps: list[Step] = []
    target = load_target(tmp_path)
    report = deploy(target, host, DeployOptions(**options), on_step=steps.append)  # type: ignore[arg-type]
    host.assert_done()
    return steps, report


def test_fresh_deploy_calls_in_order(tmp_path: Path) -> None:
    host = StrictFakeHost()
    seen: dict[str, Any] = {}
    host.expect_agent("preflight", lambda req: seen.setdefault("pre", req) and preflight())
    host.expect("put")
    host.expect("push")
    host.expect("remove")

    def apply(request: dict[str, Any]) -> dict[str, Any]:
        seen["apply"] = request
        return APPLIED

    host.expect_agent("apply", apply)
    steps, report = run_deploy(tmp_path, host, restart=True)
    assert host.calls == ["agent:preflight", "put", "push", "remove", "agent:apply"]
    assert [s.name for s in steps] == ["preflight", "upload", "lock", "install", "launch"]
    assert report.sha256 == SHA
    request = seen["apply"]
    assert request["sha256"] == SHA
    assert request["restart"] is True
    assert request["grace"] == 5
    assert request["checkpoint_mode"] == "archive"
    assert request["tmp"].startswith("/root/dflash/.train_dflash_pipeline.py.launcher-")
    assert seen["pre"]["create_workdir"] is True
    assert host.files == {}, "the host temp file must be removed"


def test_unchanged_script_skips_the_push(tmp_path: Path) -> None:
    host = StrictFakeHost()
    host.expect_agent("preflight", preflight(dest_sha256=SHA))
    host.expect_agent("apply", lambda req: APPLIED if req["tmp"] is None else {})
    steps, _ = run_deploy(tmp_path, host)
    assert steps[1] == Step(
        "upload",
        "unchanged",
        f"/root/dflash/train_dflash_pipeline.py already has sha256 {SHA[:12]}",
    )


def test_dry_run_changes_nothing(tmp_path: Path) -> None:
    host = StrictFakeHost()
    session = {"exists": True, "pane_dead": False, "dead_status": None, "pane_pid": 4242}
    host.expect_agent(
        "preflight",
        lambda req: preflight(session=session) if req["create_workdir"] is False else {},
    )
    steps, _ = run_deploy(tmp_path, host, restart=True, dry_run=True)
    assert host.calls == ["agent:preflight"]
    planned = {s.name: s.detail for s in steps if s.status == "planned"}
    assert "pane pid 4242" in planned["stop"]
    assert "archived-<UTC time>" in planned["checkpoints"]


@pytest.mark.parametrize(
    ("overrides", "options", "code", "message"),
    [
        ({"tmux": None}, {}, ExitCode.UNREACHABLE, "tmux is not installed in the container"),
        (
            {"gpus": {"visible": 2, "error": None, "holders": []}},
            {},
            ExitCode.UNREACHABLE,
            "playbook wants 8 GPUs, 2 visible",
        ),
        (
            {"session": {"exists": True, "pane_dead": False}},
            {},
            ExitCode.REFUSED,
            "session 'dflash' is running; use --restart to replace it",
        ),
        (
            {
                "lock": {
                    "operator": "ann@ws",
                    "from_host": "ws",
                    "client_pid": 7,
                    "since": "t",
                    "stale": False,
                }
            },
            {"restart": True},
            ExitCode.REFUSED,
            "another deploy is running: ann@ws from ws (pid 7, since t)",
        ),
        (
            {"checkpoints": {"exists": True, "unsafe": "symlink to /data"}},
            {},
            ExitCode.USAGE,
            "checkpoints path refused: symlink to /data",
        ),
    ],
)
def test_preflight_failures_stop_before_any_change(
    tmp_path: Path, overrides: dict[str, Any], options: dict[str, Any], code: ExitCode, message: str
) -> None:
    host = StrictFakeHost()
    host.expect_agent("preflight", preflight(**overrides))
    with pytest.raises(LauncherError) as error:
        run_deploy(tmp_path, host, **options)
    assert error.value.exit_code == code
    assert error.value.message == f"prod (pve CT 200): {message}"
    assert host.calls == ["agent:preflight"]


def test_failed_push_cleans_up_in_container_and_host(tmp_path: Path) -> None:
    host = StrictFakeHost()
    host.expect_agent("preflight", preflight())
    host.expect("put")
    host.expect("push", lambda argv: 1)
    removed: list[list[str]] = []
    host.expect("exec", lambda argv: removed.append(argv))
    host.expect("remove")
    with pytest.raises(ContainerError, match=r"pct push to .* failed"):
        run_deploy(tmp_path, host)
    assert removed and removed[0][:3] == ["rm", "-f", "--"]
    assert host.files == {}


def test_agent_refusal_reports_steps(tmp_path: Path) -> None:
    host = StrictFakeHost()
    host.expect_agent("preflight", preflight())
    host.expect("put")
    host.expect("push")
    host.expect("remove")
    host.expected.append(
        type(host.expected[0])(
            "agent:apply",
            lambda req: {
                "ok": False,
                "error": {"kind": "corrupt", "message": "transfer corrupted: expected a, got b"},
                "steps": [{"name": "verify", "status": "failed", "detail": "sha256 mismatch"}],
            },
        )
    )
    steps: list[Step] = []
    with pytest.raises(LauncherError) as error:
        deploy(load_target(tmp_path), host, DeployOptions(), on_step=steps.append)  # type: ignore[arg-type]
    assert error.value.exit_code == ExitCode.UNREACHABLE
    assert "transfer corrupted" in error.value.message
    assert steps[-1] == Step("verify", "failed", "sha256 mismatch")
