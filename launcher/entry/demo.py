"""`./run demo`: the whole loop on the local sandbox, as a new user would type it.

Brings the sandbox up, then runs the two commands the tool exists for and shows their output:
`launcher deploy --restart` and `launcher verify --wait 10`; then puts `launcher` on PATH
(a shim). Where it all goes is the caller's: the container's VMID, the sandbox's state
directory and the shim's directory are flags or environment variables, and an argument it
does not know stops it (exit 2) before anything is made.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

VMID_ENV = "LAUNCHER_SANDBOX_VMID"
STATE_DIR_ENV = "LAUNCHER_SANDBOX_DIR"  # as launcher.sandbox.manager.STATE_DIR_ENV
SHIM_DIR_ENV = "LAUNCHER_SHIM_DIR"
DEFAULT_VMID = 200
DEFAULT_STATE_DIR = "/var/lib/launcher-sandbox"  # as launcher.sandbox.manager
DEFAULT_SHIM_DIR = "/usr/local/bin"
SHIM_MARK = "# launcher shim"


def parser() -> argparse.ArgumentParser:
    env = os.environ
    found = argparse.ArgumentParser(
        prog="./run demo",
        description="Sandbox up, deploy the demo trainer, verify it, put launcher on PATH.",
    )
    found.add_argument(
        "--vmid",
        type=vmid,
        metavar="N",
        default=env.get(VMID_ENV) or DEFAULT_VMID,
        help=f"the demo's container (env {VMID_ENV}; default {DEFAULT_VMID})",
    )
    found.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        default=Path(env.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR),
        help=f"the sandbox's files (env {STATE_DIR_ENV}; default {DEFAULT_STATE_DIR})",
    )
    shim = found.add_mutually_exclusive_group()
    shim.add_argument(
        "--shim-dir",
        type=Path,
        metavar="DIR",
        default=Path(env.get(SHIM_DIR_ENV) or DEFAULT_SHIM_DIR),
        help=f"where the `launcher` shim goes (env {SHIM_DIR_ENV}; default {DEFAULT_SHIM_DIR})",
    )
    shim.add_argument("--no-shim", action="store_true", help="write no shim anywhere")
    return found


def vmid(text: str) -> int:
    """A Proxmox VMID (argparse turns the ValueError into its usage error, exit 2)."""
    value = int(str(text).strip())
    if not 100 <= value <= 999_999_999:
        raise ValueError(text)
    return value


def run(argv: list[str]) -> int:
    print(f"\n$ {shlex.join(argv)}", flush=True)
    return subprocess.run(argv, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)  # exit 2 on anything it does not know, before any change
    from launcher.core.errors import LauncherError
    from launcher.sandbox import Sandbox

    try:
        info = Sandbox(args.state_dir).up((args.vmid,), gpus=8)
    except LauncherError as exc:
        hint = f"\nhint: {exc.hint}" if exc.hint else ""
        print(f"error: {exc.message}{hint}", file=sys.stderr)
        return int(exc.exit_code)
    target = f"sandbox-{args.vmid}"
    inventory = str(info.inventory_path)
    launcher = [sys.executable, "-m", "launcher", "-i", inventory]
    print(f"sandbox ready: sshd on {info.address}:{info.port}, CT {args.vmid}")
    print(f"inventory: {inventory}")
    steps = [
        [*launcher, "inventory", "check"],
        [*launcher, "-t", target, "deploy", "--restart"],
        [*launcher, "-t", target, "verify", "--wait", "10", "--interval", "2"],
    ]
    for step in steps:
        code = run(step)
        if code != 0:
            print(f"\ndemo stopped: exit {code}", file=sys.stderr)
            return code
    if args.no_shim or not install_shim(args.shim_dir):
        activate = Path(sys.executable).parent / "activate"
        print(f"to type launcher in this shell: source {shlex.quote(str(activate))}")
    print(next_steps(info.state_dir, info.inventory_path, target))
    return 0


def next_steps(state_dir: Path, inventory: Path, target: str) -> str:
    """The commands to go on with. The sandbox's inventory is named on each (`-i`): exporting
    it (`sandbox env`) is the reader's choice, for one shell."""
    own = Path(os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR).absolute() == state_dir
    where = "" if own else f" --state-dir {shlex.quote(str(state_dir))}"
    on = f"-i {shlex.quote(str(inventory))}"
    return (
        "\nThe run keeps going in the sandbox. Next:\n"
        f"  launcher {on} status -t {target}   # one poll of the run, judged\n"
        f"  launcher {on} logs -t {target} --tail 5\n"
        f'  eval "$(launcher sandbox env{where})"   # this shell only: no -i needed after it\n'
        f"  launcher sandbox down{where}   # removes every container, process and file"
    )


def install_shim(directory: Path) -> bool:
    """`launcher` in `directory`: a two-line script that runs this .venv's launcher, written
    when the directory is writable and holds no other launcher. Whether the next `launcher`
    a shell finds on PATH is that shim."""
    target = Path(sys.executable).parent / "launcher"
    shim = directory / "launcher"
    if not (directory.is_dir() and os.access(directory, os.W_OK)):
        print(f"no shim: {directory} is not a writable directory")
        return False
    if shim.exists() and SHIM_MARK not in shim.read_text(errors="replace"):
        print(f"no shim: {shim} is another program, left as it is")
        return False
    command = shlex.quote(str(target))
    shim.write_text(f'#!/bin/sh\n{SHIM_MARK}, written by ./run demo\nexec {command} "$@"\n')
    shim.chmod(0o755)
    found = shutil.which("launcher")
    if found is None or Path(found) != shim:
        print(f"wrote {shim} (runs {target}), but `launcher` on PATH is {found or 'nothing'}")
        return False
    print(f"launcher is on PATH: {shim} runs {target}")
    return True


if __name__ == "__main__":
    sys.exit(main())
