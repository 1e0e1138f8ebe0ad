"""Configuration errors: exit 2 and one line naming file, key path and line per problem."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.cli.main import cli, main
from tests.unit.projectfiles import write_project
from tests.unit.sshagent import add_key, new_key, running_agent


@pytest.fixture
def project(tmp_path: Path) -> Path:
    write_project(tmp_path)
    return tmp_path


def check(project: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(["-i", str(project / "inventory.yaml"), "inventory", "check", *args])
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def test_valid_inventory_prints_resolved_view(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = check(project, capsys)
    assert (code, err) == (0, "")
    assert f"{project / 'inventory.yaml'}: ok (2 targets, 1 hosts)" in out
    assert (
        "target prod: pve CT 200, session dflash, /root/dflash/train_dflash_pipeline.py  (default)"
        in out
    )


def test_json_view(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = check(project, capsys, "--json")
    view = json.loads(out)
    assert code == 0
    assert view["schema"] == "launcher.inventory/1"
    targets = {t["target"]: t for t in view["targets"]}  # a list, like every envelope's
    assert targets["staging"]["vmid"] == 201
    assert targets["prod"]["checkpoints"] == "/root/dflash/checkpoints"
    assert view["hosts"]["pve"]["host_key_policy"] == "strict"


def test_missing_inventory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = check(tmp_path, capsys)
    assert code == 2
    assert err.startswith(f"error: {tmp_path / 'inventory.yaml'}: inventory file not found\n")
    assert "LAUNCHER_INVENTORY" in err  # a hint: where the file is looked for


def test_missing_identity_file_fails_the_check(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = project / "no-such-key"
    edit(
        project / "inventory.yaml",
        "    port: 22\n",
        f"    port: 22\n    identity_file: {missing}\n",
    )
    code, out, err = check(project, capsys)
    assert (code, out) == (2, "")
    assert f"inventory.yaml:6: hosts.pve.identity_file: identity file not found: {missing}" in err


def test_a_missing_identity_file_is_a_warning_when_ssh_agent_holds_a_key(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = project / "no-such-key"
    edit(
        project / "inventory.yaml",
        "    port: 22\n",
        f"    port: 22\n    identity_file: {missing}\n",
    )
    with running_agent(project, monkeypatch):
        code, _, err = check(project, capsys)
        assert code == 2 and "identity file not found" in err  # an agent, but no key in it
        add_key(new_key(project / "ci_key"))
        code, _, err = check(project, capsys)
    assert code == 0, err
    assert f"warning: {project / 'inventory.yaml'}:6: hosts.pve.identity_file:" in err
    assert "the keys ssh-agent holds are used instead" in err


def test_identity_option_is_the_key_file_checked(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = project / "no-such-key"
    edit(
        project / "inventory.yaml",
        "    port: 22\n",
        f"    port: 22\n    identity_file: {missing}\n",
    )
    key = new_key(project / "ci_key")
    monkeypatch.setenv("LAUNCHER_IDENTITY", "")  # restored after the test; the option sets it
    code, _, err = check(project, capsys, "--identity", str(key))
    assert (code, err) == (0, "")  # the inventory's missing file is not what is used
    code, _, err = check(project, capsys, "--identity", str(project / "gone"))
    assert code == 2 and f"--identity: identity file not found: {project / 'gone'}" in err


def test_unreadable_or_loose_identity_file(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = project / "id_test"
    key.write_text("not really a key\n")
    key.chmod(0o644)
    edit(project / "inventory.yaml", "    port: 22\n", f"    port: 22\n    identity_file: {key}\n")
    code, _, err = check(project, capsys)
    assert code == 0  # loose permissions: a warning, the check passes
    assert f"warning: {project / 'inventory.yaml'}:6: hosts.pve.identity_file:" in err
    assert f"chmod 600 {key}" in err
    key.chmod(0o600)
    code, _, err = check(project, capsys)
    assert (code, err) == (0, "")
    directory = project / "a-directory"
    directory.mkdir()
    edit(project / "inventory.yaml", str(key), str(directory))
    code, _, err = check(project, capsys)
    assert code == 2
    assert "identity file is not a regular file" in err


def test_missing_known_hosts_is_a_warning(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit(
        project / "inventory.yaml",
        "    port: 22\n",
        "    port: 22\n    known_hosts: /nonexistent/kh\n",
    )
    code, _, err = check(project, capsys)
    assert code == 0
    assert "hosts.pve.known_hosts: /nonexistent/kh does not exist" in err
    assert "host_key_policy: strict" in err


def test_yaml_syntax_error_names_line_and_column(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit(project / "inventory.yaml", "    port: 22\n", "    port: [22\n")
    code, _, err = check(project, capsys)
    assert code == 2
    assert err.startswith(f"error: {project / 'inventory.yaml'}:")
    assert "YAML syntax error" in err


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            "{host: pve, vmid: 200,",
            "{host: pvx, vmid: 200,",
            "inventory.yaml:9: targets.prod.host: unknown host 'pvx' (hosts: pve)",
        ),
        (
            "vmid: 201",
            "vmid: -1",
            "inventory.yaml:10: targets.staging.vmid: must be a positive integer (got -1)",
        ),
        (
            "vmid: 201",
            'vmid: "201"',
            "inventory.yaml:10: targets.staging.vmid: must be a positive integer (got '201')",
        ),
        (
            "    port: 22\n",
            "    prot: 22\n",
            "inventory.yaml:5: hosts.pve.prot: unknown key (check the spelling)",
        ),
        (
            "default_target: prod",
            "default_target: prd",
            "inventory.yaml:11: default_target: unknown target 'prd'",
        ),
        (
            "host_key_policy: strict",
            "host_key_policy: yolo",
            "inventory.yaml:6: hosts.pve.host_key_policy: Input should be 'strict' or 'accept-new'",
        ),
    ],
)
def test_inventory_errors(
    project: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, expected: str
) -> None:
    edit(project / "inventory.yaml", old, new)
    code, out, err = check(project, capsys)
    assert code == 2
    assert out == ""
    assert err == f"error: {project}/{expected}\n"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            "session: dflash",
            "session: 'a:b'",
            "dflash.yaml:2: session: 'a:b' is not a usable tmux session name "
            "(letters, digits, '_' and '-', at most 64, not starting with '-')",
        ),
        (
            "workdir: /root/dflash",
            "workdir: root/dflash",
            "dflash.yaml:3: workdir: must be an absolute path inside the container "
            "(got 'root/dflash')",
        ),
        (
            "checkpoints: checkpoints",
            "checkpoints: ../elsewhere",
            "dflash.yaml:7: checkpoints: must not contain '..': it would escape workdir "
            "(got '../elsewhere')",
        ),
        (
            "checkpoints: checkpoints",
            "checkpoints: /",
            "dflash.yaml:7: checkpoints: must be a path relative to workdir, strictly inside it "
            "(got '/')",
        ),
        (
            "checkpoints: checkpoints",
            "checkpoints: /data/ckpt",
            "dflash.yaml:7: checkpoints: must be a path relative to workdir, strictly inside it "
            "(got '/data/ckpt')",
        ),
        (
            "checkpoints: checkpoints",
            "checkpoints: .",
            "dflash.yaml:7: checkpoints: must name something inside workdir, not workdir itself "
            "(got '.')",
        ),
        (
            "  source: train.py",
            "  source: missing.py",
            "dflash.yaml:5: script.source: script not found: {dir}/missing.py",
        ),
        (
            "gpus: 8",
            "gpu: 8",
            "dflash.yaml:10: gpu: unknown key (check the spelling)",
        ),
        (
            "env: {}",
            "env: {'BAD NAME': x}",
            "dflash.yaml:9: env: 'BAD NAME' is not a valid environment variable name",
        ),
        (
            "env: {}",
            "env: {LAUNCHER_CHECKPOINTS: /tmp/x}",
            "dflash.yaml:9: env: LAUNCHER_CHECKPOINTS is launcher's own: every run gets it "
            "(docs/deploy.md)",
        ),
    ],
)
def test_playbook_errors(
    project: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, expected: str
) -> None:
    edit(project / "playbooks" / "dflash.yaml", old, new)
    code, _, err = check(project, capsys)
    assert code == 2
    expected = expected.format(dir=project / "playbooks")
    # Both targets share the playbook, so the problem is reported for each of them.
    assert err == f"error: {project}/playbooks/{expected}\n{project}/playbooks/{expected}\n"


def test_several_problems_one_line_each(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "inventory.yaml").write_text(
        textwrap.dedent(
            """\
            hosts:
              pve: {address: 10.1.2.6, colour: blue}
            targets:
              prod: {host: pve, vmid: 0, playbook: playbooks/dflash.yaml}
            """
        )
    )
    code, _, err = check(project, capsys)
    assert code == 2
    inv = project / "inventory.yaml"
    assert err.splitlines() == [
        f"error: {inv}:2: hosts.pve.colour: unknown key (check the spelling)",
        f"{inv}:4: targets.prod.vmid: must be a positive integer (got 0)",
    ]


def test_missing_playbook_names_the_inventory_line(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit(
        project / "inventory.yaml",
        "vmid: 201, playbook: playbooks/dflash.yaml",
        "vmid: 201, playbook: nope.yaml",
    )
    code, _, err = check(project, capsys)
    assert code == 2
    assert err == (
        f"error: {project}/inventory.yaml:10: targets.staging.playbook: "
        f"playbook file not found: {project}/nope.yaml\n"
    )


def test_duplicate_keys_are_errors(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit(
        project / "inventory.yaml",
        "default_target: prod",
        "default_target: prod\ndefault_target: staging",
    )
    code, _, err = check(project, capsys)
    assert code == 2
    assert (
        err == f"error: {project}/inventory.yaml:11: default_target: key appears more than once\n"
    )


def test_inventory_from_environment(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAUNCHER_INVENTORY", str(project / "inventory.yaml"))
    with pytest.raises(SystemExit) as exit_info:
        main(["inventory", "check"])
    assert exit_info.value.code == 0
    assert "ok (2 targets" in capsys.readouterr().out


def test_unknown_target_is_usage_error(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["-i", str(project / "inventory.yaml"), "-t", "nope", "deploy", "--dry-run"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        f"error: {project / 'inventory.yaml'}: unknown target 'nope' (known: prod, staging)\n"
    )


def test_every_command_has_help_with_an_example() -> None:
    runner = CliRunner()
    commands: list[list[str]] = [[]]
    for name, command in cli.commands.items():
        commands.append([name])
        for sub in getattr(command, "commands", {}):
            commands.append([name, sub])
    for path in commands:
        result = runner.invoke(cli, [*path, "--help"], prog_name="launcher")
        assert result.exit_code == 0, path
        assert "Example" in result.output or "Typical use" in result.output, f"{path}: no example"
        assert "launcher " in result.output.split("Usage:", 1)[1], path


def imported(importtime: str) -> set[str]:
    """The modules a `python -X importtime` run's stderr lists."""
    return {line.rsplit("|", 1)[1].strip() for line in importtime.splitlines() if "|" in line}


def test_version() -> None:
    """click's version option, and the console script's own answer to `--version` or `-V`
    alone: the same line, the latter without importing click."""
    from launcher import __version__

    result = CliRunner().invoke(cli, ["--version"])
    assert result.output == f"launcher, version {__version__}\n"
    fast_forms = (["--version"], ["-V"], ["-i", "x.yaml", "-q", "--version"])
    fast_forms += (["--inventory=x.yaml", "--debug", "-t", "a", "-V"], ["-ix.yaml", "--version"])
    fast_forms += (["--known-hosts", "kh", "--identity=key", "--version"],)
    for argv in fast_forms:
        fast = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "launcher", *argv],
            capture_output=True,
            text=True,
            check=False,
        )
        assert (fast.returncode, fast.stdout) == (0, result.output), argv
        assert not {"click", "launcher.cli.main"} & imported(fast.stderr), argv
    # Anything else goes to click, which answers as it always has.
    for argv, code in ((["--version", "status"], 0), (["-t", "--version"], 2)):
        slow = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "launcher", *argv],
            capture_output=True,
            text=True,
            check=False,
        )
        assert "click" in imported(slow.stderr), argv
        assert slow.returncode == code, (argv, slow.stdout, slow.stderr[-500:])
        assert (slow.stdout == result.output) == (code == 0), argv


def test_repository_inventory_is_valid(capsys: pytest.CaptureFixture[str]) -> None:
    root = Path(__file__).resolve().parents[2]
    with pytest.raises(SystemExit) as exit_info:
        main(["-i", str(root / "inventory.yaml"), "inventory", "check"])
    assert exit_info.value.code == 0, capsys.readouterr().err


def test_debug_sends_paramikos_log_to_stderr() -> None:
    """With --debug, paramiko's logger gets a stderr handler at INFO; without, it stays quiet."""
    import logging

    from launcher.cli import main as cli_main

    log = logging.getLogger("paramiko")
    before, level = list(log.handlers), log.level
    try:
        cli_main._paramiko_log(False)
        assert log.handlers == before
        cli_main._paramiko_log(True)
        added = [h for h in log.handlers if h not in before]
        assert len(added) == 1 and isinstance(added[0], logging.StreamHandler)
        assert log.level == logging.INFO
    finally:
        for handler in list(log.handlers):
            if handler not in before:
                log.removeHandler(handler)
        log.setLevel(level)


def test_a_check_the_status_format_cannot_feed_is_a_warning(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A DFlash playbook's queues under the megatron preset: Megatron prints no q_pre."""
    book = project / "playbooks" / "dflash.yaml"
    edit(
        book,
        "verify: {wait: 180, interval: 10}",
        "status: {preset: megatron}\nverify: {wait: 180, interval: 10, queues: {q_pre: 6}}",
    )
    code, _, err = check(project, capsys)
    assert code == 0
    assert err == (
        f"warning: {book}:13: verify.queues.q_pre: the megatron preset's lines carry no "
        "'q_pre': this check can never be judged (map it under status.fields.queues, or "
        "drop it)\n"
    )
    edit(book, "status: {preset: megatron}", "status: {preset: nanogpt}")
    edit(book, "queues: {q_pre: 6}", "loss: {ceiling: 10.8}")
    assert check(project, capsys)[2] == ""  # nanoGPT prints its loss
    edit(book, "status: {preset: nanogpt}", "status: {preset: nanogpt, fields: {watch: [gn]}}")
    _, _, err = check(project, capsys)
    assert "status.fields.watch.0: the nanogpt preset's lines carry no 'gn'" in err
    edit(
        book,
        "status: {preset: nanogpt, fields: {watch: [gn]}}",
        "status: {format: regex, pattern: 'it (?P<step>\\d+)'}",
    )
    _, _, err = check(project, capsys)
    assert "verify.loss.ceiling: the status pattern's named groups carry no loss" in err


def test_megatrons_loss_dict_keys_are_fields_it_may_print() -> None:
    """training_log prints every key of its loss dict (` {}: {:.6E} |`): no warning for one."""
    from launcher.verify.fieldcheck import unproducible
    from launcher.verify.formats import StatusSpec
    from launcher.verify.spec import ChecksSpec

    status = StatusSpec.model_validate(
        {"preset": "megatron", "fields": {"watch": ["mtp_1 loss", "params norm", "q_pre"]}}
    )
    found = unproducible(status, ChecksSpec())
    assert [where for where, _ in found] == [("status", "fields", "watch", 2)]
