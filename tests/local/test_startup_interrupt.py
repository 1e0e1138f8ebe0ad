"""A Ctrl-C that lands where the interpreter cannot raise it (the weakref callback of an import's
module lock) while launcher starts: exit 130 and "interrupted", as any Ctrl-C at start-up, not
"Exception ignored ... KeyboardInterrupt" and a command that runs on as if nothing was pressed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# A weakref callback that raises KeyboardInterrupt runs when `module` is about to be imported:
# what CPython does with a SIGINT that arrives while such a callback runs (it is reported
# through sys.unraisablehook and dropped).
SCRIPT = """
import sys, weakref

class Referent:
    pass

held = [Referent()]

def callback(_ref):
    raise {exc}

ref = weakref.ref(held[0], callback)

class DropAtImport:
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            held.clear()
        return None

sys.meta_path.insert(0, DropAtImport())
sys.argv = ["launcher", "-i", {inventory!r}, "status"]
{entry}
"""
RUN_MAIN = "import runpy; runpy.run_module('launcher', run_name='__main__', alter_sys=True)"
CONSOLE_SCRIPT = "from launcher.entry.console import main; main()"
ENTRIES = [
    pytest.param(RUN_MAIN, "launcher.entry.console", id="python -m launcher, loading console"),
    pytest.param(CONSOLE_SCRIPT, "launcher.cli.main", id="console script, loading the CLI"),
]


def run(entry: str, module: str, exc: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    """`launcher status` with an inventory that does not exist: a command that, once it runs,
    fails at once without any connection."""
    inventory = str(tmp / "missing inventory.yaml")
    script = SCRIPT.format(exc=exc, module=module, entry=entry, inventory=inventory)
    env = {k: v for k, v in os.environ.items() if k != "LAUNCHER_CONTROL_PERSIST"}
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**env, "CI": "true", "XDG_RUNTIME_DIR": str(tmp)},
    )


@pytest.mark.parametrize(("entry", "module"), ENTRIES)
def test_a_lost_ctrl_c_while_loading_exits_130(entry: str, module: str, tmp_path: Path) -> None:
    result = run(entry, module, "KeyboardInterrupt", tmp_path)
    assert (result.returncode, result.stderr, result.stdout) == (130, "interrupted\n", "")


@pytest.mark.parametrize(("entry", "module"), ENTRIES)
def test_any_other_lost_exception_keeps_the_interpreters_report(
    entry: str, module: str, tmp_path: Path
) -> None:
    result = run(entry, module, "ValueError('from a callback')", tmp_path)
    assert "Exception ignored" in result.stderr and "from a callback" in result.stderr
    assert "missing inventory.yaml" in result.stderr  # and the command ran on
    assert result.returncode == 2, result.stderr
