"""`launcher sandbox up|down|status|freeze|thaw|stall`: the local staging host (sshd + LXC + pct
stand-in) and the faults of a real node it can play."""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import click

from launcher.core.errors import UsageError
from launcher.core.params import PCT_CALLS, SANDBOX_GPUS, SANDBOX_STALL, STALL_CALLS

if TYPE_CHECKING:
    from launcher.sandbox import Sandbox

# launcher.sandbox.rootfs.CHOICES (not imported here: `launcher --help` stays light)
DISTROS = ("host", "bullseye", "bookworm", "trixie")

state_dir_option = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="State directory (default: env LAUNCHER_SANDBOX_DIR, else /var/lib/launcher-sandbox).",
)


def _sandbox(state_dir: Path | None) -> Sandbox:
    if os.geteuid() != 0:
        raise UsageError("launcher sandbox needs root (run with sudo)")
    from launcher.sandbox import Sandbox

    return Sandbox(state_dir)


def parse_vmids(values: tuple[str, ...]) -> list[int]:
    """`200`, `200,201` and `200-215`, repeatable; default 200."""
    vmids: list[int] = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            first, dash, last = part.partition("-")
            if not (first.isdigit() and (not dash or last.isdigit())):
                raise UsageError(f"invalid --vmid {part!r}: use 200, 200,201 or 200-215")
            low, high = int(first), int(last) if dash else int(first)
            if high < low:
                raise UsageError(f"invalid --vmid range {part!r}")
            vmids.extend(range(low, high + 1))
    return sorted(set(vmids)) or [200]


@click.group()
def sandbox() -> None:
    """A local staging Proxmox host: sshd on 127.0.0.1, LXC containers, a pct stand-in.

    \b
    Example (as root):
      launcher sandbox up --vmid 200,201 --gpus 8
      eval "$(launcher sandbox env)"
      launcher deploy --restart
      launcher sandbox down
    """


@sandbox.command("up")
@click.option(
    "--vmid",
    "vmid_values",
    multiple=True,
    metavar="VMIDS",
    envvar="LAUNCHER_SANDBOX_VMID",
    help="Container IDs: 200, 200,201 or 200-215 (repeatable; default: env "
    "LAUNCHER_SANDBOX_VMID, else 200).",
)
@click.option(
    "--gpus",
    type=SANDBOX_GPUS,
    default=8,
    show_default=True,
    help="Fake GPUs per container: a count (0 makes nvidia-smi fail like a missing driver), or "
    "which of the host's GPUs by minor number (6,7: /dev/nvidia6 and /dev/nvidia7, nvidia-smi "
    "index 0 and 1, as a CI staging CT given a slice of the host).",
)
@click.option(
    "--distro",
    type=click.Choice(DISTROS),
    default=None,
    help="Root filesystem of new containers (default host: bind-mounts this machine's /usr; "
    "seconds, offline). A Debian release is built once with debootstrap and cached in "
    "/var/cache/launcher-sandbox/rootfs (env LAUNCHER_SANDBOX_CACHE). An existing container "
    "keeps its own.",
)
@click.option(
    "--network",
    is_flag=True,
    help="Put the containers on a bridge of their own (10.213.0.0/24, nothing leaves the "
    "machine) so they reach each other, with a job `demo-job` over them in the inventory.",
)
@click.option(
    "--hosts",
    type=click.Choice(("static", "dhcp", "all")),
    default="static",
    show_default=True,
    help="With --network: each /etc/hosts as Proxmox writes it, the CT's own name on its "
    "static address or (dhcp) on 127.0.1.1; `all` adds every container's name.",
)
@state_dir_option
def up(
    vmid_values: tuple[str, ...],
    gpus: int | list[int],
    distro: str | None,
    network: bool,
    hosts: str,
    state_dir: Path | None,
) -> None:
    """Create or repair the sandbox and write its inventory (idempotent).

    Running containers are kept; missing ones are added; a stopped sshd is restarted
    (on a new port if its old one was taken). A container keeps the root filesystem it
    was made with.

    \b
    State dir: --state-dir, else env LAUNCHER_SANDBOX_DIR, else /var/lib/launcher-sandbox.
    It holds everything the sandbox made: inventory.yaml (targets sandbox and sandbox-VMID),
    playbooks/demo.yaml, the SSH key and known_hosts, sshd, the LXC containers.
    \b
    The demo trainer's behaviour is set by DEMO_MODE in the playbook's env:
      healthy (default), crash, stall, flat, nan, silent, crashloop, diverge,
      sag, finalizer-noise, nan-gradnorm, bursty, hang, cpu-fallback, one-gpu, idle-gpus
    (DEMO_CRASH_AFTER, DEMO_STALL_AFTER, DEMO_NAN_AFTER, DEMO_HANG_AFTER: seconds before it
    misbehaves; DEMO_INTERVAL: seconds between status lines; DEMO_FORMAT: dflash, hf, jsonl, pipes;
    DEMO_STEPS: finish with exit 0 after this many steps; DEMO_LOAD_SECONDS: a silent model
    load first.)
    \b
    Example:
      sudo launcher sandbox up --vmid 200-203 --gpus 8
      sudo launcher sandbox up --vmid 202 --distro bullseye   # Python 3.9, tmux 3.1c
      sudo launcher sandbox up --vmid 209 --gpus 6,7   # a staging CT with 2 of the host's 8
      sudo launcher sandbox up --vmid 200,201 --network   # a two-node job
      eval "$(launcher sandbox env)"      # LAUNCHER_INVENTORY for the commands that follow
    Exit codes: 0 up, 2 bad input, not root or no root filesystem, 3 a container or sshd
    did not start.
    """
    vmids = parse_vmids(vmid_values)
    sb = _sandbox(state_dir)
    started = time.monotonic()
    info = sb.up(vmids, gpus=gpus, distro=distro)
    addresses = sb.connect(vmids, hosts=hosts) if network else {}
    elapsed = time.monotonic() - started
    status = sb.status()
    keys = ["-i", str(info.identity_file), "-o", f"UserKnownHostsFile={info.known_hosts}"]
    login = f"{info.user}@{info.address}"
    ssh = shlex.join(["ssh", *keys, "-p", str(info.port), login, "pct", "list"])
    click.echo(f"sandbox up in {elapsed:.1f}s")
    click.echo(f"  sshd:       {info.address}:{info.port} (pid {status.sshd_pid})")
    click.echo(f"  containers: {_containers(status.containers, sb)}")
    shown = gpus if isinstance(gpus, int) else f"{len(gpus)} (minors {', '.join(map(str, gpus))})"
    click.echo(f"  gpus:       {shown} fake GPU(s) in {', '.join(map(str, vmids))}")
    if addresses:
        shown = ", ".join(f"{vmid} {address}" for vmid, address in addresses.items())
        click.echo(f"  network:    {shown}")
    click.echo(f"  state dir:  {info.state_dir}")
    click.echo(f"  inventory:  {info.inventory_path}")
    click.echo(f"  playbook:   {info.state_dir / 'playbooks' / 'demo.yaml'}")
    click.echo(f"  try:        {ssh}")
    click.echo(
        f"              launcher -i {shlex.quote(str(info.inventory_path))} deploy -t sandbox"
    )
    click.echo('  or:         eval "$(launcher sandbox env)"; launcher deploy')


@sandbox.command("env")
@state_dir_option
def env(state_dir: Path | None) -> None:
    """Print the shell line that points this shell's launcher at the sandbox's inventory.

    Nothing is started or checked: it prints `export LAUNCHER_INVENTORY=<state dir>/inventory.yaml`
    for the state dir (--state-dir, else env LAUNCHER_SANDBOX_DIR, else /var/lib/launcher-sandbox).
    Opt-in, per shell: only a shell that evals it uses the sandbox without -i, in any directory
    (`status` and `deploy` then name the inventory on stderr); `unset LAUNCHER_INVENTORY` ends it.

    \b
    Example:
      eval "$(launcher sandbox env)"
      launcher status
    Exit codes: 0 printed.
    """
    from launcher.sandbox import Sandbox

    inventory = Sandbox(state_dir).inventory_path
    click.echo(f"export LAUNCHER_INVENTORY={shlex.quote(str(inventory))}")
    # stderr: what `eval` does not run, the person reads.
    click.echo(
        f"this shell's launcher commands now use {inventory} (status and deploy say so); "
        "`unset LAUNCHER_INVENTORY` goes back to ./inventory.yaml",
        err=True,
    )


@sandbox.command("down")
@state_dir_option
def down(state_dir: Path | None) -> None:
    """Stop and remove every container, process and file of the sandbox.

    \b
    Example:
      sudo launcher sandbox down
    Only what `launcher sandbox up` made is removed: a directory without its marker
    (.launcher-sandbox) is refused, and files put next to the sandbox's stay.
    \b
    Exit codes: 0 removed (or nothing to remove), 2 not root or not a sandbox's directory.
    """
    sb = _sandbox(state_dir)
    existed = sb.state_dir.exists()
    left = sb.down()
    if not existed:
        click.echo(f"no sandbox in {sb.state_dir}; nothing to do")
    elif left:
        names = ", ".join(str(p.relative_to(sb.state_dir)) for p in left)
        click.echo(f"sandbox removed from {sb.state_dir}; kept what it did not make: {names}")
    else:
        click.echo(f"sandbox removed: {sb.state_dir}")


@sandbox.command("status")
@state_dir_option
def status(state_dir: Path | None) -> None:
    """Show whether the sandbox's sshd answers and which containers run.

    \b
    Example:
      sudo launcher sandbox status
    Exit codes: 0 shown (healthy or not), 2 not root.
    """
    sb = _sandbox(state_dir)
    st = sb.status()
    if not st.exists:
        click.echo(f"no sandbox in {st.state_dir} (run: launcher sandbox up)")
        return
    sshd = (
        f"running, pid {st.sshd_pid}, 127.0.0.1:{st.port}"
        if st.sshd_alive
        else f"NOT answering (pid {st.sshd_pid}, port {st.port})"
    )
    click.echo(f"state dir:  {st.state_dir}")
    click.echo(f"sshd:       {sshd}")
    click.echo(f"containers: {_containers(st.containers, sb) or 'none'}")
    click.echo(f"inventory:  {sb.inventory_path}")
    if not st.healthy:
        click.echo("repair with: launcher sandbox up")


VZDUMP_LOCKS = ("backup", "snapshot", "none")


@sandbox.command("freeze")
@click.argument("vmid", type=click.IntRange(100, 999_999_999))
@click.option(
    "--lock",
    type=click.Choice(VZDUMP_LOCKS),
    default="backup",
    show_default=True,
    help="The lock set in the CT's config first, as vzdump does (none: freeze only).",
)
@state_dir_option
def freeze(vmid: int, lock: str, state_dir: Path | None) -> None:
    """Freeze a container as a vzdump backup in suspend mode does: `lock: backup` in its
    config, then its cgroup frozen. Every `pct exec` into it then hangs until `thaw`.

    \b
    Example:
      sudo launcher sandbox freeze 200
      launcher status          # exit 3: CT 200 is locked (backup) — the run is paused
      sudo launcher sandbox thaw 200
    Exit codes: 0 frozen, 2 not root, 3 the container could not be frozen.
    """
    sb = _sandbox(state_dir)
    sb.freeze(vmid, None if lock == "none" else lock)
    click.echo(f"CT {vmid} frozen" + ("" if lock == "none" else f", lock: {lock}"))


@sandbox.command("thaw")
@click.argument("vmid", type=click.IntRange(100, 999_999_999))
@click.option("--keep-lock", is_flag=True, help="Thaw only; leave the lock in the config.")
@state_dir_option
def thaw(vmid: int, keep_lock: bool, state_dir: Path | None) -> None:
    """Thaw a container and clear its lock, as the end of a backup does.

    \b
    Example:
      sudo launcher sandbox thaw 200
    Exit codes: 0 thawed, 2 not root.
    """
    sb = _sandbox(state_dir)
    sb.thaw(vmid, unlock=not keep_lock)
    click.echo(f"CT {vmid} thawed" + ("" if keep_lock else ", lock cleared"))


@sandbox.command("stall")
@click.argument("seconds", type=SANDBOX_STALL)
@click.option("--skip", type=PCT_CALLS, default=0, help="Let this many pct calls pass first.")
@click.option("--calls", type=STALL_CALLS, default=1, show_default=True,
              help="How many pct calls stall.")  # fmt: skip
@state_dir_option
def stall(seconds: float, skip: int, calls: int, state_dir: Path | None) -> None:
    """Make the next pct call(s) on the sandbox's host wait SECONDS before doing anything, as a
    `pct` held up on a busy node does (0 ends a stall not yet served).

    \b
    Example:
      sudo launcher sandbox stall 70 --skip 1   # the stop's own call, after its first look
      launcher stop --grace 1                   # exit 3: the stop may still complete …
    Exit codes: 0 set, 2 not root.
    """
    sb = _sandbox(state_dir)
    sb.stall_pct(seconds, skip=skip, calls=calls)
    if seconds > 0:
        click.echo(f"pct calls {skip + 1} to {skip + calls} from now wait {seconds:g} s")
    else:
        click.echo("no pct call stalls")


def _containers(states: Mapping[int, str], sb: Sandbox) -> str:
    """`200 running (host), 202 running (bullseye)`."""
    return ", ".join(
        f"{vmid} {state} ({sb.distro(vmid)})" for vmid, state in sorted(states.items())
    )
