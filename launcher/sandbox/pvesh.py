#!/usr/bin/python3
# mypy: allow-untyped-calls
"""Stand-in for Proxmox's `pvesh` (the two cluster reads launcher uses), and a node's `pct` guard.

Installed as <state_dir>/bin/pvesh. Which node "runs" each VMID is read from
<state_dir>/cluster.json ({"nodes": {NAME: {"ip": ..., "online": bool}}, "vms": {VMID: NAME},
"qemu": {VMID: NAME}, "props": {VMID: {"lock": ..., "hastate": ...}}}), so a test migrates a
container, takes a node offline or adds a QEMU guest by rewriting it (launcher.sandbox.cluster).

The rows are Proxmox's (pve-manager PVE/API2/Cluster.pm, the `resources` call, and
PVE/API2Tools.pm: extract_vm_stats): a guest whose node sends no stats (offline) has only id,
vmid, node, type and `status: unknown`; `lock` (from its config) and `hastate` (from the HA
manager) are added when set, whatever the node's state; `--type vm` lists QEMU guests too.

Called as `pct` (a symlink in a second node's bin dir, whose sshd sets LAUNCHER_SANDBOX_NODE),
it refuses a VMID that runs on another node as the real pct does, and otherwise runs the
sandbox's pct stand-in.
"""

import json
import os
import sys

STATE_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
STATE_FILE = os.path.join(STATE_DIR, "cluster.json")
NODE_ENV = "LAUNCHER_SANDBOX_NODE"


def load_state():
    try:
        with open(STATE_FILE) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return {"nodes": {}, "vms": {}}
    return state if isinstance(state, dict) else {"nodes": {}, "vms": {}}


def resources(state):
    nodes = state.get("nodes", {})
    guests = [(vmid, node, "lxc") for vmid, node in state.get("vms", {}).items()]
    guests += [(vmid, node, "qemu") for vmid, node in state.get("qemu", {}).items()]
    rows = []
    for vmid, node, kind in sorted(guests, key=lambda g: int(g[0])):
        row = {"id": "%s/%s" % (kind, vmid), "vmid": int(vmid), "node": node, "type": kind}
        row["status"] = "unknown"
        if nodes.get(node, {}).get("online", True):
            row.update(status="running", name="ct%s" % vmid, uptime=1, maxcpu=2, cpu=0.0)
        props = state.get("props", {}).get(vmid, {})
        row.update({key: props[key] for key in ("lock", "hastate") if props.get(key)})
        rows.append(row)
    return rows


def cluster_status(state):
    rows = [{"type": "cluster", "id": "cluster", "name": "sandbox", "quorate": 1}]
    here = os.environ.get(NODE_ENV, "")
    for index, (name, node) in enumerate(sorted(state.get("nodes", {}).items())):
        rows.append(
            {
                "type": "node",
                "id": "node/%s" % name,
                "name": name,
                "ip": node.get("ip"),
                "nodeid": index + 1,
                "online": int(bool(node.get("online", True))),
                "local": int(name == here),
            }
        )
    return rows


def pvesh(argv):
    if len(argv) < 2 or argv[0] != "get" or "--output-format" not in argv:
        sys.stderr.write("pvesh stand-in: only `get PATH ... --output-format json` is supported\n")
        return 2
    state = load_state()
    path = argv[1]
    if path == "/cluster/resources":
        data = resources(state)
    elif path == "/cluster/status":
        data = cluster_status(state)
    else:
        sys.stderr.write("no such path '%s'\n" % path)
        return 2
    sys.stdout.write(json.dumps(data) + "\n")
    return 0


def pct_guard(argv):
    """The real pct only knows the containers of its own node."""
    here = os.environ.get(NODE_ENV)
    vmid = argv[1] if len(argv) > 1 and argv[1].isdigit() else None
    owner = load_state().get("vms", {}).get(vmid) if vmid else None
    if here and owner and owner != here:
        sys.stderr.write(
            "Configuration file 'nodes/%s/lxc/%s.conf' does not exist\n" % (here, vmid)
        )
        return 2
    pct = os.path.join(STATE_DIR, "bin", "pct")
    os.execv(pct, [pct, *argv])
    return 0  # not reached


def main():
    if os.path.basename(sys.argv[0]) == "pct":
        return pct_guard(sys.argv[1:])
    return pvesh(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
