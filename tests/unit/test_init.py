"""`launcher init`'s answers and files, without a host: parsing, names, the two documents, the
host key's known_hosts states, and refusing to replace files (before any question)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml

from launcher.cli.main import main
from launcher.config.models import load_inventory
from launcher.core.errors import UsageError
from launcher.deploy import init
from launcher.transport import hostkey

KEY = hostkey.HostKey(
    "[10.1.2.6]:2222",
    "ssh-ed25519",
    "AAAAC3NzaC1lZDI1NTE5AAAAIEvOCzjFRMd75ycR6jdNkL/uBpIUqcDOp/Y+IZXs6IwP",
    "SHA256:yv78FZOPRMLdBsUZh+Ole4eIvrHnRbQ0nEBF//v6ivY",
)


def test_host_answers() -> None:
    assert init.parse_host("10.1.2.6") == ("root", "10.1.2.6", 22)
    assert init.parse_host("ops@pve1:2222", port=22, user="root") == ("ops", "pve1", 2222)
    assert init.parse_host("[fe80::1]:22") == ("root", "fe80::1", 22)
    assert init.parse_host("pve", port=2200, user="admin") == ("admin", "pve", 2200)
    for bad in ("", "a b", "pve:99999", "pve:port"):
        with pytest.raises(UsageError):
            init.parse_host(bad)


def test_names() -> None:
    assert init.default_name(Path("train_gpt.py")) == "train_gpt"
    assert init.default_name(Path("my trainer (v2).py")) == "my-trainer-v2"
    assert init.default_name(Path("...py")) == "train"
    assert init.check_name("gpt-2_small") == "gpt-2_small"
    with pytest.raises(UsageError):
        init.check_name("-x")


def test_the_documents_load_as_an_inventory_and_a_playbook(tmp_path: Path) -> None:
    trainer = tmp_path / "src" / "train.py"
    trainer.parent.mkdir()
    trainer.write_text("print('step 1 | loss 2')\n")
    answers = init.Answers("10.1.2.6", 2222, "root", 200, trainer, "python3 train.py", "gpt", 8)
    inventory = tmp_path / "inventory.yaml"
    playbook = init.playbook_path(inventory, "gpt")
    status = {"format": "keyvalue", "fields": {"throughput": "tok/s"}}
    init.write_yaml(inventory, init.inventory_document(answers, playbook, inventory), "# x\n")
    init.write_yaml(playbook, init.playbook_document(answers, playbook, status), "# x\n")
    target = load_inventory(inventory).target("gpt")
    assert (target.vmid, target.host.address, target.host.port) == (200, "10.1.2.6", 2222)
    assert target.playbook.script_source == trainer.resolve()
    spec = target.playbook.spec
    assert (spec.session, spec.workdir, spec.command, spec.gpus) == (
        "gpt", "/root/gpt", "python3 train.py", 8,
    )  # fmt: skip
    assert spec.status.format == "keyvalue" and spec.status.fields.throughput == "tok/s"
    # DFlash's own lines need no block; none found writes none either.
    for nothing in ({}, None):
        assert "status" not in init.playbook_document(answers, playbook, nothing)
    assert yaml.safe_load(inventory.read_text())["hosts"]["pve"] == {
        "address": "10.1.2.6",
        "port": 2222,
    }


def test_known_hosts_states(tmp_path: Path) -> None:
    known = tmp_path / ".ssh" / "known_hosts"
    assert hostkey.known(known, KEY) == "unknown"
    hostkey.remember(known, KEY)
    assert known.read_text() == KEY.line() and (known.stat().st_mode & 0o777) == 0o600
    assert (known.parent.stat().st_mode & 0o777) == 0o700
    assert hostkey.known(known, KEY) == "same"
    other = hostkey.HostKey(KEY.entry, KEY.key_type, KEY.base64[:-8] + "AAAAAAAA", "SHA256:x")
    assert hostkey.known(known, other) == "changed"
    elsewhere = hostkey.HostKey("10.1.2.7", KEY.key_type, KEY.base64, KEY.fingerprint)
    assert hostkey.known(known, elsewhere) == "unknown"
    assert hostkey.known_hosts_entry("pve", 22) == "pve"


def test_existing_files_are_refused_before_any_question(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LAUNCHER_INVENTORY", raising=False)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    (tmp_path / "inventory.yaml").write_text("hosts: {}\n")
    with pytest.raises(SystemExit) as exited:
        main(["init"])
    out, err = capsys.readouterr()
    assert exited.value.code == 2, err
    assert "error: inventory.yaml exists: nothing written" in err
    assert "--force replaces it" in err
    assert "Proxmox host" not in out + err  # nothing was asked
    assert (tmp_path / "inventory.yaml").read_text() == "hosts: {}\n"
