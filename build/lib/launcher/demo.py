"""`./run demo`: the whole loop on the local sandbox, as a new user would type it.

Brings the sandbox up, then runs the two commands the tool exists for and shows their output:
`launcher deploy --restart` and `launcher verify --wait 10`.
"""

from __future__ import annotations

import shlex
import subprocess
import sys

from launcher.sandbox import Sandbox


def run(argv: list[str]) -> int:
    print(f"\n$ {shlex.join(argv)}", flush=True)
    return subprocess.run(argv, check=False).returncode


def main() -> int:
    info = Sandbox().up((200,), gpus=8)
    launcher = [sys.executable, "-m", "launcher", "-i", str(info.inventory_path)]
    print(f"sandbox ready: sshd on {info.address}:{info.port}, CT {info.vmids[0]}")
    print(f"inventory: {info.inventory_path}")
    steps = [
        [*launcher, "inventory", "check"],
        [*launcher, "-t", "sandbox", "deploy", "--restart"],
        [*launcher, "-t", "sandbox", "verify", "--wait", "10", "--interval", "2"],
    ]
    for argv in steps:
        code = run(argv)
        if code != 0:
            print(f"\ndemo stopped: exit {code}", file=sys.stderr)
            return code
    print(
        "\nThe run keeps going in the sandbox. Next:\n"
        '  eval "$(launcher sandbox env)"   # or: export '
        f"LAUNCHER_INVENTORY={shlex.quote(str(info.inventory_path))}\n"
        "  launcher status                  # one poll of the run, judged\n"
        "  launcher sandbox down            # removes every container, process and file"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
