"""Writes a small valid project (inventory, playbook, script) for unit tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.agent.tmux import no_session
from launcher.config.models import Target, load_inventory

# The agent's own answer for a missing session (protocol.SessionState): the client checks
# every key, so the fakes answer with exactly what the agent sends.
NO_SESSION: dict[str, Any] = no_session()

PLAYBOOK = """\
name: dflash
session: dflash
workdir: /root/dflash
script:
  source: train.py
  dest: train_dflash_pipeline.py
checkpoints: checkpoints
command: python3 train_dflash_pipeline.py
env: {}
gpus: 8
stop_grace: 5
verify: {wait: 180, interval: 10}
"""

INVENTORY = """\
hosts:
  pve:
    address: 10.1.2.6
    user: root
    port: 22
    host_key_policy: strict
    connect_timeout: 10
targets:
  prod:    {host: pve, vmid: 200, playbook: playbooks/dflash.yaml}
  staging: {host: pve, vmid: 201, playbook: playbooks/dflash.yaml}
default_target: prod
"""

SCRIPT = b"print('training')\n"


def write_project(root: Path) -> Path:
    (root / "playbooks").mkdir(parents=True, exist_ok=True)
    (root / "playbooks" / "train.py").write_bytes(SCRIPT)
    (root / "playbooks" / "dflash.yaml").write_text(PLAYBOOK)
    (root / "inventory.yaml").write_text(INVENTORY)
    return root / "inventory.yaml"


def load_target(root: Path, name: str = "prod") -> Target:
    return load_inventory(write_project(root)).target(name)


def preflight_answer(**overrides: Any) -> dict[str, Any]:
    """What the agent's preflight says about a healthy container (fields overridable)."""
    answer: dict[str, Any] = {
        "python": "3.11.2",
        "tmux": "tmux 3.3a",
        "workdir": {"exists": True, "writable": True, "created": False},
        "free_bytes": 10 * 2**30,
        "gpus": {
            "visible": 8,
            "names": [],
            "error": None,
            "holders": [],
            "skipped": False,
            "outside": [],
            "watchers": "",
        },
        "session": dict(NO_SESSION),
        "dest_sha256": None,
        "checkpoints": {"path": "/root/dflash/checkpoints", "exists": True, "unsafe": None},
        "lock": None,
    }
    answer.update(overrides)
    return answer
