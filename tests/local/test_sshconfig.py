"""ssh_config as launcher reads it: OpenSSH's own answer (`ssh -G`), paramiko's parser where no
OpenSSH client is installed, and how it merges with the inventory (inventory values win)."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.config.models import HostSpec, parse_jumps
from launcher.core.errors import AuthError, ConfigError, ExitCode
from launcher.transport import sshconfig, sshkeys
from launcher.transport.endpoint import Endpoint
from launcher.transport.resolve import resolve_endpoint
from launcher.transport.sshconfig import Hop, HostOptions, expand_proxy_command, split_jump
from tests.unit.sshagent import add_key, running_agent

HAS_SSH = shutil.which("ssh") is not None
needs_openssh = pytest.mark.skipif(not HAS_SSH, reason="the OpenSSH client (ssh) is not installed")


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No ~/.ssh of the developer, no agent."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return home


@pytest.fixture(params=["openssh", "paramiko"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each lookup test runs against `ssh -G` and against the paramiko fallback."""
    if request.param == "openssh" and not HAS_SSH:
        pytest.skip("the OpenSSH client (ssh) is not installed")
    if request.param == "paramiko":
        monkeypatch.setattr(sshconfig.shutil, "which", lambda name: None)
    yield request.param


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


CONFIG = """
Host pve
  HostName 10.1.2.6
  User ops
  Port 2222
  IdentityFile /keys/pve
  UserKnownHostsFile /kh/pve
Host bastion
  HostName 10.0.0.1
  Port 2200
  User jumper
Host plain
  Compression yes
"""


def test_an_alias_gives_what_its_block_sets(tmp_path: Path, backend: str) -> None:
    config = write(tmp_path / "config", CONFIG)
    pve, plain = sshconfig.lookup(["pve", "plain"], config)
    assert pve == HostOptions(
        alias="pve",
        hostname="10.1.2.6",
        user="ops",
        port=2222,
        identity_files=("/keys/pve",),
        known_hosts="/kh/pve",
    )
    # Nothing set: OpenSSH's defaults (local user, port 22, default keys) count as unset.
    assert plain == HostOptions(alias="plain")


@needs_openssh
def test_include_and_match_work_through_openssh(tmp_path: Path) -> None:
    included = write(tmp_path / "conf.d" / "pve.conf", "Host pve\n  HostName 10.1.2.6\n")
    config = write(
        tmp_path / "config",
        f"Include {included.parent}/*.conf\nMatch originalhost pve\n  Port 2202\n",
    )
    (pve,) = sshconfig.lookup(["pve"], config)
    assert (pve.hostname, pve.port) == ("10.1.2.6", 2202)


def test_a_missing_config_file_means_no_settings(tmp_path: Path, backend: str) -> None:
    assert sshconfig.lookup(["pve"], tmp_path / "absent") == [HostOptions(alias="pve")]


def test_bad_ssh_config_is_a_config_error_naming_file_and_line(
    tmp_path: Path, backend: str
) -> None:
    config = write(tmp_path / "config", "Host pve\n  Port notaport\n")
    with pytest.raises(ConfigError) as error:
        sshconfig.lookup(["pve"], config)
    assert error.value.exit_code == ExitCode.USAGE
    if backend == "openssh":
        assert f"{config} line 2" in error.value.message


@needs_openssh
def test_a_user_config_others_can_write_is_refused(_home: Path) -> None:
    config = write(_home / ".ssh" / "config", "Host pve\n  ProxyCommand evil %h\n")
    config.chmod(0o666)
    with pytest.raises(ConfigError, match="bad owner or permissions"):
        sshconfig.lookup(["pve"])
    config.chmod(0o600)
    (pve,) = sshconfig.lookup(["pve"])
    assert pve.proxy_command == "evil %h"


# --------------------------------------------------------------------------- with the inventory


def endpoint(config: Path, name: str = "pve", **spec: object) -> Endpoint:
    return resolve_endpoint(name, HostSpec.model_validate(spec), config)


def test_the_host_name_is_an_alias_and_inventory_values_win(tmp_path: Path, backend: str) -> None:
    config = write(tmp_path / "config", CONFIG)
    ep = endpoint(config, address="192.0.2.10", port=22, identity_file="/mine")
    # The address is connected to; the name's block fills User and known_hosts; the
    # inventory's explicit port and identity file win over the block's.
    assert (ep.hostname, ep.port, ep.user) == ("192.0.2.10", 22, "ops")
    assert ep.identity_files == ("/mine",)
    assert ep.known_hosts == Path("/kh/pve")
    assert ep.jump is None and ep.via is None


def test_the_address_is_an_alias_too(tmp_path: Path, backend: str) -> None:
    config = write(tmp_path / "config", CONFIG + "Host prod\n  User produser\n")
    ep = endpoint(config, name="prod", address="pve")
    # The name's block wins where both set something (User); the address's HostName is
    # followed and its block fills the rest.
    assert (ep.hostname, ep.port, ep.user) == ("10.1.2.6", 2222, "produser")
    assert ep.identity_files == ("/keys/pve",)


def test_unset_everywhere_falls_back_to_inventory_defaults(tmp_path: Path, backend: str) -> None:
    ep = endpoint(write(tmp_path / "config", CONFIG), name="x", address="plain")
    assert (ep.hostname, ep.port, ep.user) == ("plain", 22, "root")
    assert ep.identity_files == ()
    assert ep.known_hosts == Path("~/.ssh/known_hosts").expanduser()


def test_jump_hosts_are_resolved_as_aliases_nearest_first(tmp_path: Path, backend: str) -> None:
    config = write(tmp_path / "config", CONFIG + "Host inner\n  HostName 10.0.0.2\n")
    ep = endpoint(config, name="x", address="10.1.2.9", jump="bastion,admin@inner:2022")
    assert ep.jump == "bastion,admin@inner:2022"
    inner = ep.via
    assert inner is not None and inner.via is not None
    bastion = inner.via
    assert (inner.name, inner.hostname, inner.port, inner.user) == (
        "x (jump 2)",
        "10.0.0.2",
        2022,
        "admin",
    )
    # The alias's own Port and User apply to a hop that does not say.
    assert (bastion.name, bastion.hostname, bastion.port, bastion.user) == (
        "x (jump 1)",
        "10.0.0.1",
        2200,
        "jumper",
    )
    assert bastion.via is None
    # Deadlines and host key policy are the target's.
    assert bastion.connect_timeout == ep.connect_timeout and not bastion.accept_new


def test_proxyjump_from_ssh_config_and_none_in_the_inventory(tmp_path: Path, backend: str) -> None:
    config = write(tmp_path / "config", CONFIG + "Host behind\n  ProxyJump bastion\n")
    routed = endpoint(config, name="behind", address="10.9.9.9")
    assert routed.jump == "bastion" and routed.via is not None
    assert routed.via.name == "behind (jump)" and routed.via.port == 2200
    direct = endpoint(config, name="behind", address="10.9.9.9", jump="none")
    assert direct.jump is None and direct.via is None


def test_the_nearest_hop_follows_its_own_proxyjump(tmp_path: Path, backend: str) -> None:
    config = write(
        tmp_path / "config",
        CONFIG + "Host inner\n  HostName 10.0.0.2\n  ProxyJump bastion\n",
    )
    ep = endpoint(config, name="x", address="10.1.2.9", jump="inner")
    assert ep.via is not None and ep.via.hostname == "10.0.0.2"
    assert ep.via.via is not None and ep.via.via.hostname == "10.0.0.1"


def test_a_jump_chain_that_loops_is_a_config_error(tmp_path: Path, backend: str) -> None:
    config = write(tmp_path / "config", CONFIG + "Host loop\n  HostName 10.1.2.6\n  Port 2222\n")
    with pytest.raises(ConfigError, match=r"loops through 10\.1\.2\.6:2222") as error:
        endpoint(config, name="x", address="pve", jump="bastion,loop")
    assert error.value.exit_code == ExitCode.USAGE


def test_proxy_command_tokens_are_expanded(tmp_path: Path) -> None:
    config = write(
        tmp_path / "config",
        "Host pc\n  HostName 10.3.3.3\n  Port 2022\n  User u\n  ProxyCommand nc -X %% %h %p\n",
    )
    ep = endpoint(config, name="pc", address="pc")
    assert ep.proxy_command == "nc -X % 10.3.3.3 2022"
    assert ep.jump is None and ep.via is None
    assert (
        expand_proxy_command("ssh -W %h:%p %r@gw # %n", host="h", port=2, user="u", alias="a")
        == "ssh -W h:2 u@gw # a"
    )
    with pytest.raises(ConfigError, match="unknown token %x"):
        expand_proxy_command("nc %x", host="h", port=2, user="u", alias="a")


def test_jump_forms() -> None:
    assert split_jump("a, root@b:2200,ssh://c") == [
        Hop(None, "a", None),
        Hop("root", "b", 2200),
        Hop(None, "c", None),
    ]
    assert split_jump("[fd00::1]:22") == [Hop(None, "fd00::1", 22)]
    assert split_jump("none") == []
    for bad in ("a,,b", "b:0", "b:x"):
        with pytest.raises(ConfigError):
            split_jump(bad)
    assert parse_jumps("a,admin@b:2200") == [(None, "a", 22), ("admin", "b", 2200)]
    assert parse_jumps("none") == []
    with pytest.raises(ValueError, match="must be"):
        parse_jumps("a,")


# --------------------------------------------------------------------------- keys


def keygen(path: Path, passphrase: str, *extra: str) -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-f", str(path), *extra],
        check=True,
    )
    return path


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs ssh-keygen")
def test_encrypted_keys_are_recognised_without_the_passphrase(tmp_path: Path) -> None:
    plain = sshkeys.read_key_file(keygen(tmp_path / "plain", ""))
    locked = sshkeys.read_key_file(keygen(tmp_path / "locked", "s3cret"))
    assert plain is not None and not plain.encrypted and plain.key_type == "ssh-ed25519"
    assert locked is not None and locked.encrypted and locked.key_type == "ssh-ed25519"
    public = (tmp_path / "locked.pub").read_text().split()[1]
    assert locked.public_blob == base64.b64decode(public)
    assert sshkeys.read_key_file(tmp_path / "locked.pub") is None

    ep = endpoint(tmp_path / "none", address="h", identity_file=str(tmp_path / "locked"))
    assert sshkeys.locked_keys(ep) == [tmp_path / "locked"]  # no agent holds it
    with pytest.raises(AuthError, match="no terminal to ask on"):
        sshkeys.unlock(ep)  # pytest's stdin is no terminal
    assert sshkeys._load(tmp_path / "locked", "ssh-ed25519", "wrong") is None
    assert sshkeys._load(tmp_path / "locked", "ssh-ed25519", "s3cret") is not None


def test_identity_option_names_the_key_of_every_host_and_hop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAUNCHER_IDENTITY", "/ci/key")
    ep = endpoint(tmp_path / "none", address="h", identity_file="/inv/key", jump="j1,j2")
    assert ep.identity_files == ("/ci/key",)
    assert ep.via is not None and ep.via.identity_files == ("/ci/key",)
    assert ep.via.via is not None and ep.via.via.identity_files == ("/ci/key",)


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs ssh-keygen")
def test_a_missing_identity_file_falls_back_to_an_agent_that_holds_a_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_agent(tmp_path, monkeypatch):
        missing_identity_file_with_an_agent(tmp_path, capsys)


def missing_identity_file_with_an_agent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "not-on-this-runner"
    spec = {"address": "h", "identity_file": str(missing)}
    # The agent holds no key: the file stays, and connecting says it is missing (exit 3).
    assert endpoint(tmp_path / "none", **spec).identity_files == (str(missing),)
    assert capsys.readouterr().err == ""
    key = keygen(tmp_path / "ci", "")
    add_key(key)
    assert endpoint(tmp_path / "none", name="ci1", **spec).identity_files == ()
    warned = capsys.readouterr().err
    assert f"ci1: identity_file {missing} does not exist; using the keys ssh-agent" in warned
    # A file that exists is offered as it is, agent or not.
    assert endpoint(tmp_path / "none", address="h", identity_file=str(key)).identity_files == (
        str(key),
    )


def fresh_python(code: str) -> list[str]:
    """The lines a new interpreter prints running `code` (imports as a command would do them)."""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return result.stdout.split("\n")


def test_the_ssh_stack_is_imported_only_to_connect() -> None:
    """paramiko, cryptography, invoke and Fabric cost ~0.3 s to import: not for `--help`, nor
    for loading the modules that connect, nor for a configuration error."""
    code = (
        "import sys\n"
        "import launcher.transport.pool, launcher.container.pct, launcher.targets.fleet\n"
        "import launcher.deploy.deploy\n"
        "from launcher.cli.main import main\n"
        "print(sorted(m for m in ('paramiko', 'fabric', 'invoke', 'cryptography')"
        " if m in sys.modules))\n"
    )
    assert fresh_python(code)[:1] == ["[]"]


def test_control_persist_defaults_to_launcher_control_persist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host that sets no control_persist gets LAUNCHER_CONTROL_PERSIST's seconds (the console
    script sets 60 on an interactive terminal); the inventory's own value wins, 0 included; a
    host whose key is unlocked on the terminal never gets a default; a bad value means off."""
    config = write(tmp_path / "config", "")
    monkeypatch.delenv("LAUNCHER_CONTROL_PERSIST", raising=False)
    assert endpoint(config, address="h").control_persist == 0.0
    monkeypatch.setenv("LAUNCHER_CONTROL_PERSIST", "60")
    assert endpoint(config, address="h").control_persist == 60.0
    assert endpoint(config, address="h", control_persist=0).control_persist == 0.0
    assert endpoint(config, address="h", control_persist=5).control_persist == 5.0
    assert endpoint(config, address="h", passphrase="prompt").control_persist == 0.0
    for bad in ("soon", "-1", "nan", "1e9", ""):
        monkeypatch.setenv("LAUNCHER_CONTROL_PERSIST", bad)
        assert endpoint(config, address="h").control_persist == 0.0, bad


def test_the_console_sets_the_default_only_on_an_interactive_terminal_and_not_in_ci(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from launcher.entry import console
    from launcher.transport import persistidle as persist

    class Tty:
        def __init__(self, tty: bool) -> None:
            self.tty = tty

        def isatty(self) -> bool:
            return self.tty

    for ci, stdin, stderr, expected in (
        (None, True, True, "60"),
        ("true", True, True, None),
        (None, False, True, None),  # piped into: a script
        (None, True, False, None),  # its errors captured: a script
    ):
        monkeypatch.delenv(persist.DEFAULT_ENV, raising=False)
        if ci is None:
            monkeypatch.delenv("CI", raising=False)
        else:
            monkeypatch.setenv("CI", ci)
        monkeypatch.setattr("sys.stdin", Tty(stdin))
        monkeypatch.setattr("sys.stderr", Tty(stderr))
        console._persist_when_interactive()
        assert os.environ.get(persist.DEFAULT_ENV) == expected
    assert float("60") == persist.INTERACTIVE_IDLE
    monkeypatch.setenv(persist.DEFAULT_ENV, "0")  # the user's own setting wins
    console._persist_when_interactive()
    assert os.environ[persist.DEFAULT_ENV] == "0"
