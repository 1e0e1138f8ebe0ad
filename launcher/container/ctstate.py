"""Why a container does not answer: its lock and its freezer, asked of the host in one call.

A call into a CT can hang without anything being wrong with the run. A vzdump backup in suspend
mode (and in snapshot mode with several volumes) sets `lock: backup` in the CT's config and
freezes the CT's cgroup for its final copy (pve-container `src/PVE/VZDump/LXC.pm`: `lock_vm`,
`suspend_vm` → `PVE::LXC::freeze`, which asks LXC's monitor to freeze on a cgroup v2 host and
writes the v1 freezer otherwise, `src/PVE/LXC.pm`). `pct exec` checks neither the lock nor the
freezer (`src/PVE/CLI/pct.pm`, `exec`: it loads the config, checks the CT runs, and execs
`lxc-attach`), and lxc-attach moves its process into the frozen cgroup, where it stops at once:
every call waits until the backup thaws the CT. So when a call does not answer, one bounded host
command asks `pct status VMID --verbose` (`status`, `lock` and the CT's init `pid`: `vmstatus`
copies the config's `lock`) and reads the freezer state of that pid's cgroup (cgroup v2:
`cgroup.events`' `frozen`, which a frozen ancestor sets too; v1: `freezer.state`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from launcher.container.pct import HostShell, host_command
from launcher.core.errors import LauncherError

# Locks under which a CT's run is paused rather than down: a backup, a snapshot being taken.
PAUSING_LOCKS = ("backup", "snapshot")
# The least time worth spending on the question (a real `pct` takes 0.3-0.5 s to start).
MIN_SECONDS = 1.0

# Runs on the host with its python3 (-I -S: 3.5+, standard library only, as the relay's host
# side): argv VMID SECONDS; prints one JSON object.
PROBE = r"""
import json, subprocess, sys
vmid, limit = sys.argv[1], float(sys.argv[2])
found = {"status": None, "lock": None, "pid": None, "freezer": None, "error": None}
def freezer(pid):
    try:
        lines = open("/proc/%s/cgroup" % pid).read().splitlines()
    except OSError:
        return None
    places = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "freezer" in controllers.split(","):  # a v1 freezer is the one LXC uses, if any
            places.insert(0, ("/sys/fs/cgroup/freezer" + path + "/freezer.state", None))
        elif controllers == "":
            places += [("/sys/fs/cgroup" + path + "/cgroup.events", "frozen"),
                       ("/sys/fs/cgroup/unified" + path + "/cgroup.events", "frozen")]
    for name, key in places:
        try:
            text = open(name).read()
        except OSError:
            continue
        if key is None:
            return text.strip().lower()
        for row in text.splitlines():
            if row.startswith(key + " "):
                return "frozen" if row.split()[1] == "1" else "thawed"
    return None
try:
    proc = subprocess.Popen(["pct", "status", vmid, "--verbose"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out = proc.communicate(timeout=limit)[0].decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        found["error"] = "`pct status` did not answer within %g s either" % limit
        out = ""
    for line in out.splitlines():
        key, sep, value = line.partition(": ")
        if sep and key in ("status", "lock", "pid"):
            found[key] = value.strip()
    if out and proc.returncode:
        found["error"] = out.strip()[-300:]
except OSError as exc:
    found["error"] = str(exc)
if found["pid"] and found["pid"].isdigit():
    found["freezer"] = freezer(found["pid"])
print(json.dumps(found))
"""


@dataclass(frozen=True)
class CtState:
    """What the host says of a CT that did not answer a call."""

    vmid: int
    status: str | None = None  # running | stopped | None: not known
    lock: str | None = None  # backup | snapshot | migrate | ...
    frozen: bool = False
    error: str | None = None  # why the host could not tell

    @property
    def paused(self) -> bool:
        """The run is paused, not down: a frozen CT, or one under a backup or snapshot."""
        return self.frozen or self.lock in PAUSING_LOCKS

    def sentence(self) -> str | None:
        """`CT 200 is locked (backup) — the run is paused, not down; …`, or None when the host
        saw nothing that explains it."""
        held = f"CT {self.vmid} is "
        if self.lock and self.paused:
            why = held + f"locked ({self.lock}) — the run is paused, not down"
            if self.frozen:
                why += "; its processes are frozen until the backup thaws them"
            return why + " (a vzdump backup locks the CT, and freezes it in suspend mode)"
        if self.frozen:
            return held + "frozen — the run is paused, not down (someone froze its cgroup)"
        if self.lock:
            return held + f"locked ({self.lock}): Proxmox is working on it"
        if self.error:
            return f"the host could not say why: {self.error}"
        if self.status and self.status != "running":
            return held + self.status
        return None


def probe_command(vmid: int, seconds: float) -> str:
    return host_command(["python3", "-I", "-S", "-c", PROBE, str(vmid), f"{seconds:g}"])


def ct_state(host: HostShell, vmid: int, seconds: float) -> CtState:
    """Ask the host (one command, within `seconds`) about CT `vmid`'s lock and freezer. Never
    raises: what could not be found out is in `error`."""
    # The host's pct gets most of the time, the connection the rest.
    inner = max(seconds * 0.8, MIN_SECONDS / 2)
    try:
        result = host.run(probe_command(vmid, inner), timeout=seconds)
    except LauncherError as error:
        return CtState(vmid, error=f"asking the host failed too: {error.message}")
    try:
        found = json.loads(result.out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return CtState(vmid, error=f"unreadable answer (exit {result.exit_code}): {result.tail(2)}")
    if not isinstance(found, dict):
        return CtState(vmid, error="unreadable answer")
    freezer = str(found.get("freezer") or "")
    return CtState(
        vmid,
        status=_text(found.get("status")),
        lock=_text(found.get("lock")),
        frozen=freezer in ("frozen", "freezing"),
        error=_text(found.get("error")),
    )


def _text(value: object) -> str | None:
    return str(value) if value not in (None, "") else None
