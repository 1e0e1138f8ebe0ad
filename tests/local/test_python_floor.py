"""What runs inside a container runs on the container's python3: Python 3.8 syntax and standard
library, checked statically here (the oldest interpreter the suite runs them on is bullseye's
3.9, in tests/e2e/test_distros.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

LAUNCHER = Path(__file__).resolve().parents[2] / "launcher"
# The agent and the contract it imports; the sandbox's programs that run in a container.
# Every module of the agent's package (its loader too), found by listing it: a new one is covered.
AGENT = sorted((LAUNCHER / "agent").glob("*.py"))
IN_CONTAINER = [
    LAUNCHER / "agent" / "protocol.py",
    *AGENT,
    LAUNCHER / "sandbox" / "ctinit.py",
    LAUNCHER / "sandbox" / "nvidia_smi.py",
    LAUNCHER / "sandbox" / "demo_trainer.py",
]
FLOOR = "3.8"


def test_container_side_needs_no_newer_python_than_the_floor() -> None:
    # Annotations are not evaluated (`from __future__ import annotations`): vermin's default.
    # A newer call guarded at run time carries `# novermin` on its line.
    vermin = Path(sys.executable).with_name("vermin")
    result = subprocess.run(
        [str(vermin), f"-t={FLOOR}-", "--no-tips", "--violations", *map(str, IN_CONTAINER)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Minimum required versions: {FLOOR}" in result.stdout, result.stdout


def test_the_agent_and_protocol_say_they_defer_annotations() -> None:
    """Without the future import, `dict[str, int]` in an annotation fails on 3.8 at import."""
    assert len(AGENT) > 10
    for path in [LAUNCHER / "agent" / "protocol.py", *AGENT]:
        assert "from __future__ import annotations" in path.read_text(), path
