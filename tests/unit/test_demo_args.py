"""`./run demo` goes where it is told: its VMID, state dir and shim dir from flags or the
environment, an argument it does not know refused (exit 2) before anything is made; and the
inventory a shell's environment chose is named by status and deploy."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from launcher.cli.main import main
from launcher.entry import demo


def test_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (demo.VMID_ENV, demo.STATE_DIR_ENV, demo.SHIM_DIR_ENV):
        monkeypatch.delenv(name, raising=False)
    args = demo.parser().parse_args([])
    assert (args.vmid, args.state_dir, args.shim_dir, args.no_shim) == (
        200,
        Path("/var/lib/launcher-sandbox"),
        Path("/usr/local/bin"),
        False,
    )
    monkeypatch.setenv(demo.VMID_ENV, "320")
    monkeypatch.setenv(demo.STATE_DIR_ENV, "/srv/sb")
    monkeypatch.setenv(demo.SHIM_DIR_ENV, "/opt/bin")
    args = demo.parser().parse_args([])
    assert (args.vmid, args.state_dir, args.shim_dir) == (320, Path("/srv/sb"), Path("/opt/bin"))
    args = demo.parser().parse_args(["--vmid", "321", "--state-dir", "/x", "--no-shim"])
    assert (args.vmid, args.state_dir, args.no_shim) == (321, Path("/x"), True)


@pytest.mark.parametrize(
    "argv",
    [
        ["--vmid", "320", "--bogus"],
        ["320"],
        ["--vmid", "99"],
        ["--vmid", "abc"],
        ["--shim-dir", "/x", "--no-shim"],
    ],
)
def test_anything_else_is_refused_before_the_sandbox_is_touched(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delitem(sys.modules, "launcher.sandbox", raising=False)
    with pytest.raises(SystemExit) as exited:
        demo.main(argv)
    assert exited.value.code == 2
    assert "usage: ./run demo" in capsys.readouterr().err
    assert "launcher.sandbox" not in sys.modules  # refused before the sandbox was even loaded


def test_an_invalid_vmid_from_the_environment_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(demo.VMID_ENV, "two hundred")
    with pytest.raises(SystemExit) as exited:
        demo.main([])
    assert exited.value.code == 2 and "--vmid" in capsys.readouterr().err


def test_the_shim_is_written_only_where_no_other_launcher_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert demo.install_shim(tmp_path)
    shim = (tmp_path / "launcher").read_text()
    assert (
        shim.startswith("#!/bin/sh\n# launcher shim") and str(Path(sys.executable).parent) in shim
    )
    assert os.access(tmp_path / "launcher", os.X_OK)
    assert f"launcher is on PATH: {tmp_path}/launcher" in capsys.readouterr().out
    assert demo.install_shim(tmp_path)  # its own shim is rewritten
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "launcher").write_text("#!/bin/sh\necho another program\n")
    assert not demo.install_shim(other)
    assert (other / "launcher").read_text() == "#!/bin/sh\necho another program\n"
    assert "is another program, left as it is" in capsys.readouterr().out
    assert not demo.install_shim(tmp_path / "missing")


def test_the_next_steps_name_the_state_dir_only_when_sandbox_env_would_not_find_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(demo.STATE_DIR_ENV, raising=False)
    default = Path("/var/lib/launcher-sandbox")
    text = demo.next_steps(default, default / "inventory.yaml", "sandbox-200")
    assert "launcher sandbox env)" in text and "--state-dir" not in text
    assert "-i /var/lib/launcher-sandbox/inventory.yaml status -t sandbox-200" in text
    text = demo.next_steps(Path("/srv/sb"), Path("/srv/sb/inventory.yaml"), "sandbox-320")
    assert 'eval "$(launcher sandbox env --state-dir /srv/sb)"' in text
    assert "launcher sandbox down --state-dir /srv/sb" in text


def status_stderr(
    args: list[str], capsys: pytest.CaptureFixture[str], command: str, *after: str
) -> str:
    with pytest.raises(SystemExit) as exited:
        main([*args, command, *after])
    assert exited.value.code == 2  # the inventory does not exist: nothing is reached
    return capsys.readouterr().err


@pytest.mark.parametrize("command", ["status", "deploy"])
def test_status_and_deploy_name_an_inventory_from_the_environment(
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    chosen = tmp_path / "sandbox" / "inventory.yaml"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LAUNCHER_INVENTORY", str(chosen))
    err = status_stderr([], capsys, command)
    assert err.startswith(f"inventory: {chosen} (from LAUNCHER_INVENTORY)\n"), err
    (tmp_path / "inventory.yaml").write_text("hosts: {}\n")
    err = status_stderr([], capsys, command)
    assert "(from LAUNCHER_INVENTORY; ./inventory.yaml here is not used)" in err
    assert "from LAUNCHER_INVENTORY" not in status_stderr(["-q"], capsys, command)
    assert "from LAUNCHER_INVENTORY" not in status_stderr(["-i", str(chosen)], capsys, command)
    assert "from LAUNCHER_INVENTORY" not in status_stderr([], capsys, command, "-i", str(chosen))
    monkeypatch.delenv("LAUNCHER_INVENTORY")
    assert "inventory: " not in status_stderr(["-i", str(chosen)], capsys, command)
