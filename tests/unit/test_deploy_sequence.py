"""The deploy sequence against a strict fake host: order of calls, and what stops it early."""

from __future__ import annotations

import base64
import hashlib
import shlex
from pathlib import Path
from typing import Any

import pytest

from launcher.core.errors import ContainerError, ExitCode, LauncherError
from launcher.deploy import deploy as deploy_module
from launcher.deploy.deploy import DeployOptions, deploy
from launcher.targets.workflow import Step
from tests.unit.fakehost import StrictFakeHost
from tests.unit.projectfiles import SCRIPT, load_target
from tests.unit.projectfiles import preflight_answer as preflight

SHA = hashlib.sha256(SCRIPT).hexdigest()


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


def expect_upload(host: StrictFakeHost, push_code: int = 0, task_error: str = "") -> None:
    host.expect("push", lambda argv: (push_code, task_error))
    if not push_code:
        host.expect("verify")


def test_deploy_is_one_transaction_with_the_script_inline(tmp_path: Path) -> None:
    host = StrictFakeHost()
    seen: dict[str, Any] = {}

    def apply(request: dict[str, Any]) -> dict[str, Any]:
        seen["apply"] = request
        return APPLIED

    host.expect_agent("apply", apply)
    steps, report = run_deploy(tmp_path, host, restart=True)
    assert host.calls == ["agent:apply"]
    assert [s.name for s in steps] == ["upload", "lock", "install", "launch"]
    assert report.sha256 == SHA
    request = seen["apply"]
    assert base64.b64decode(request["content_b64"]) == SCRIPT
    assert request["tmp"] is None
    assert request["sha256"] == SHA
    assert request["restart"] is True
    assert request["grace"] == 5
    assert request["checkpoint_mode"] == "archive"
    assert request["check_resources"] is True
    assert request["need_bytes"] > len(SCRIPT)


@pytest.fixture
def push_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scripts over the inline limit go by `pct push`; make every script one of those."""
    monkeypatch.setattr(deploy_module, "INLINE_LIMIT", 0)


@pytest.mark.usefixtures("push_path")
def test_large_script_workdir_first_then_pushed_checked_and_one_transaction(
    tmp_path: Path,
) -> None:
    host = StrictFakeHost()
    seen: dict[str, Any] = {}
    host.expect_agent("preflight", lambda req: preflight() if req["create_workdir"] else {})
    expect_upload(host)
    host.expect_agent("apply", lambda req: seen.setdefault("apply", req) and APPLIED)
    steps, _ = run_deploy(tmp_path, host, restart=True)
    # pct push creates no directory: the workdir first, the pushed file checked in the CT.
    assert host.calls == ["agent:preflight", "push", "verify", "agent:apply"]
    assert list(host.pushed.values()) == [SCRIPT]
    assert seen["apply"]["content_b64"] is None
    assert seen["apply"]["tmp"].startswith("/root/dflash/.train_dflash_pipeline.py.launcher-")
    assert steps[0].name == "upload" and "size and sha256 checked" in steps[0].detail


@pytest.mark.usefixtures("push_path")
def test_push_that_exits_zero_with_a_task_error_is_a_failed_push(tmp_path: Path) -> None:
    """A real pct push whose write fails prints the task's error and exits 0."""
    host = StrictFakeHost()
    host.expect_agent("preflight", preflight())
    error = "failed to create file: /root/dflash/.x.tmp: No such file or directory"
    expect_upload(host, task_error=error)
    removed: list[list[str]] = []
    host.expect("exec", lambda argv: removed.append(argv))
    with pytest.raises(ContainerError, match=r"pct push to .* failed: failed to create file"):
        run_deploy(tmp_path, host)
    assert host.calls == ["agent:preflight", "push", "verify", "exec"]  # no transaction
    assert removed[0][:3] == ["rm", "-f", "--"]


@pytest.mark.usefixtures("push_path")
def test_perls_locale_warnings_on_a_push_that_worked_are_not_an_error(tmp_path: Path) -> None:
    """A node with a broken locale: every Perl program (pct) warns on stderr; the file is right."""
    host = StrictFakeHost()
    host.expect_agent("preflight", preflight())
    warning = "perl: warning: Setting locale failed.\nperl: warning: Falling back to C\n"
    host.expect("push", lambda argv: (0, warning))
    host.expect("verify")
    host.expect_agent("apply", APPLIED)
    real_run = host.run

    def run(command: str, **kwargs: Any) -> Any:
        result = real_run(command, **kwargs)
        if "launcher-push" in command:  # the file was written despite the warning
            host.pushed[shlex.split(command)[5]] = kwargs["stdin"]
        return result

    host.run = run  # type: ignore[method-assign]
    run_deploy(tmp_path, host)
    assert host.calls == ["agent:preflight", "push", "verify", "agent:apply"]


@pytest.mark.usefixtures("push_path")
def test_push_that_wrote_nothing_and_said_nothing_is_caught_by_the_check(tmp_path: Path) -> None:
    host = StrictFakeHost()
    host.expect_agent("preflight", preflight())
    host.expect("push", lambda argv: (0, ""))
    host.expect("verify", lambda argv: None)
    host.expect("exec")
    real_run = host.run

    def run(command: str, **kwargs: Any) -> Any:
        if "launcher-push" in command:
            result = real_run(command, **kwargs)
            host.pushed.clear()  # the write went nowhere
            return result
        return real_run(command, **kwargs)

    host.run = run  # type: ignore[method-assign]
    with pytest.raises(ContainerError, match=r"pushed file .* is not there"):
        run_deploy(tmp_path, host)
    assert host.calls == ["agent:preflight", "push", "verify", "exec"]


def test_dry_run_is_the_transaction_in_plan_mode(tmp_path: Path) -> None:
    """--dry-run runs the deploy's own checks (in the agent), in one call that changes nothing."""
    host = StrictFakeHost()
    seen: dict[str, Any] = {}
    planned = [
        {"name": "active_check", "status": "ok", "detail": "restart requested"},
        {"name": "stop", "status": "planned", "detail": "session 'dflash' (pane pid 4242): C-c"},
    ]

    def apply(request: dict[str, Any]) -> dict[str, Any]:
        seen.update(request)
        return {"ok": True, "error": None, "warnings": [], "steps": planned}

    host.expect_agent("apply", apply)
    steps, _ = run_deploy(tmp_path, host, restart=True, dry_run=True)
    assert host.calls == ["agent:apply"]
    assert seen["plan"] is True and seen["restart"] is True
    assert base64.b64decode(seen["content_b64"]) == SCRIPT
    assert [(s.name, s.status) for s in steps] == [("active_check", "ok"), ("stop", "planned")]


@pytest.mark.parametrize(
    ("kind", "code"),
    [
        ("missing", ExitCode.UNREACHABLE),
        ("refused", ExitCode.REFUSED),
        ("locked", ExitCode.REFUSED),
        ("unsafe_path", ExitCode.USAGE),
    ],
)
def test_dry_run_refusals_map_to_exit_codes(tmp_path: Path, kind: str, code: ExitCode) -> None:
    host = StrictFakeHost()
    failed = {"name": "check", "status": "failed", "detail": "no", "kind": kind}
    host.expect_agent(
        "apply", {"ok": False, "error": {"kind": kind, "message": "no"}, "steps": [failed]}
    )
    with pytest.raises(LauncherError) as error:
        run_deploy(tmp_path, host, dry_run=True)
    assert error.value.exit_code == code
    assert host.calls == ["agent:apply"]


@pytest.mark.parametrize(
    ("kind", "message", "code"),
    [
        ("missing", "tmux is not installed in the container", ExitCode.UNREACHABLE),
        ("missing", "playbook wants 8 GPUs, 2 visible", ExitCode.UNREACHABLE),
        ("refused", "session 'dflash' is running; use --restart to replace it", ExitCode.REFUSED),
        ("locked", "another deploy is running: ann@ws", ExitCode.REFUSED),
        ("unsafe_path", "checkpoints path 'c' is unsafe: a symlink", ExitCode.USAGE),
        ("corrupt", "transfer corrupted: expected a, got b", ExitCode.UNREACHABLE),
        ("compile", "SyntaxError: invalid syntax", ExitCode.USAGE),
    ],
)
def test_transaction_refusals_map_to_exit_codes(
    tmp_path: Path, kind: str, message: str, code: ExitCode
) -> None:
    host = StrictFakeHost()
    host.expect_agent(
        "apply",
        {
            "ok": False,
            "error": {"kind": kind, "message": message},
            "steps": [{"name": "check", "status": "failed", "detail": message}],
        },
    )
    steps: list[Step] = []
    with pytest.raises(LauncherError) as error:
        deploy(load_target(tmp_path), host, DeployOptions(), on_step=steps.append)  # type: ignore[arg-type]
    assert error.value.exit_code == code
    assert error.value.message == f"prod (pve CT 200): {message}"
    assert steps[-1] == Step("check", "failed", message)


@pytest.mark.usefixtures("push_path")
def test_failed_push_cleans_up_in_container_and_host(tmp_path: Path) -> None:
    host = StrictFakeHost()
    host.expect_agent("preflight", preflight())
    expect_upload(host, push_code=1)
    removed: list[list[str]] = []
    host.expect("exec", lambda argv: removed.append(argv))
    with pytest.raises(ContainerError, match=r"pct push to .* failed"):
        run_deploy(tmp_path, host)
    assert removed and removed[0][:3] == ["rm", "-f", "--"]
