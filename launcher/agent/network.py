# mypy: allow-untyped-calls
"""The `network` op: what torchrun will need from this container's network, asked before a
job's deploy changes anything (launcher.jobs.network decides with it).

- its hostname and the name torch 1.13's elastic agent publishes for it (`_get_fq_hostname`,
  torch/distributed/elastic/agent/server/api.py: socket.getfqdn(socket.gethostname()));
- its interfaces and addresses (`ip -o addr`, else `hostname -I`);
- the names asked for, looked up as torch looks them up (getaddrinfo);
- the torch a python here has, read from its files without importing it (an import costs
  seconds): its version and whether its torchrun has `--local_addr`;
- on rank 0: a listener on the master port for a bounded time; elsewhere: a bounded probe of
  it, retried until the listener is up.
"""

from __future__ import annotations

import json
import os
import time

from launcher.agent.base import AgentError, run, which
from launcher.agent.params import param

# socket and errno are imported where used: BOOT preloads only what every call needs.

# Run by each python asked for (without -I -S: torch is on its site path). Reads torch's own
# files: version.py's __version__, and run.py for torchrun's --local_addr option.
TORCH_PROBE = """
import importlib.util, json, os, re
spec = importlib.util.find_spec("torch")
places = list(spec.submodule_search_locations or []) if spec else []
def read(path):
    try:
        with open(os.path.join(places[0], path)) as f:
            return f.read()
    except (OSError, IndexError):
        return ""
found = re.search(r"__version__\\s*=\\s*['\\"]([^'\\"]+)", read("version.py"))
run = read(os.path.join("distributed", "run.py"))
print(json.dumps(None if not places else {
    "version": found.group(1) if found else None,
    "local_addr": "--local_addr" in run or "--local-addr" in run,
}))
"""
HOSTS = "/etc/hosts"
MAX_NAMES = 1024  # one per node of a job
MAX_SECONDS = 60.0
RESOLVE_SECONDS = 20.0  # names left when it is spent are reported as not looked up


def op_network(request, warnings):
    names = param(request, "resolve", list, default=[])
    pythons = param(request, "pythons", list, default=[])
    listen = param(request, "listen", dict)
    probe = param(request, "probe", dict)
    hosts = param(request, "hosts", dict)
    if len(names) > MAX_NAMES or not all(isinstance(n, str) and n for n in names):
        raise AgentError("invalid", "resolve: at most %d names" % MAX_NAMES)
    if not all(isinstance(p, str) and p for p in pythons):
        raise AgentError("invalid", "pythons: a list of commands")
    import socket

    hostname = socket.gethostname()
    answer = {
        "hostname": hostname,
        "fqdn": socket.getfqdn(hostname),
        "interfaces": interfaces(),
        "resolved": resolve_all(names),
        "torch": torch_info(pythons),
        "listened": None,
        "probed": None,
        "hosts": None,
    }
    if listen is not None:
        answer["listened"] = listen_for(
            _port(listen), _seconds(listen), _count(listen.get("expect"))
        )
    if probe is not None:
        address = probe.get("address")
        if not isinstance(address, str) or not address:
            raise AgentError("invalid", "probe: an address")
        answer["probed"] = probe_port(address, _port(probe), _seconds(probe))
    if hosts is not None:
        answer["hosts"] = write_hosts_block(HOSTS, hosts.get("marker"), hosts.get("lines"))
    return answer


def _port(spec):
    port = spec.get("port")
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise AgentError("invalid", "port: 1..65535")
    return port


def _seconds(spec):
    seconds = spec.get("seconds")
    if not isinstance(seconds, (int, float)) or not 0 < seconds <= MAX_SECONDS:
        raise AgentError("invalid", "seconds: more than 0, at most %d" % MAX_SECONDS)
    return float(seconds)


def _count(value):
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise AgentError("invalid", "expect: a count")
    return value


def interfaces():
    """[{name, address, prefix}] of every address but loopback's, from `ip -o addr show`;
    without `ip`, `hostname -I`'s addresses with no interface named."""
    code, out, _ = run(["ip", "-o", "addr", "show"], timeout=10)
    found = []
    if code == 0:
        for line in out.splitlines():
            fields = line.split()
            if len(fields) < 4 or fields[2] not in ("inet", "inet6"):
                continue
            address, _, prefix = fields[3].partition("/")
            if fields[1] == "lo":
                continue
            found.append({"name": fields[1], "address": address, "prefix": _int(prefix)})
        return found
    code, out, _ = run(["hostname", "-I"], timeout=10)
    for address in out.split() if code == 0 else []:
        found.append({"name": None, "address": address, "prefix": None})
    return found


def _int(text):
    try:
        return int(text)
    except ValueError:
        return None


def write_hosts_block(path, marker, lines):
    """Replace the block `marker` in the hosts file with `lines` (appended when absent); the
    rest of the file, Proxmox's own section included, is kept as it is. Proxmox rewrites only
    its `# --- BEGIN PVE ---` section (pve-container, Setup/Base.pm `ct_modify_file`), so
    the block outlives a CT restart."""
    if not isinstance(marker, str) or not marker or "\n" in marker:
        raise AgentError("invalid", "hosts: a marker")
    if not isinstance(lines, list) or not all(_host_line(line) for line in lines):
        raise AgentError("invalid", "hosts: lines of an address and names")
    begin, end = "# --- BEGIN %s ---" % marker, "# --- END %s ---" % marker
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        text = ""
    kept, inside = [], False
    for line in text.splitlines():
        if line.strip() == begin:
            inside = True
        elif line.strip() == end and inside:
            inside = False
        elif not inside:
            kept.append(line)
    block = [begin, *lines, end] if lines else []
    content = "\n".join(kept + block) + "\n"
    try:
        _replace(path, content)
    except OSError as exc:
        raise AgentError("failed", "cannot write %s: %s" % (path, exc.strerror or exc)) from None
    return path


def _replace(path, content):
    """A whole new file renamed into place; in place only where a rename cannot be (a file
    bind-mounted into the container: EBUSY)."""
    tmp = path + ".launcher-tmp"
    with open(tmp, "w") as f:
        f.write(content)
    try:
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError:
        os.unlink(tmp)
        with open(path, "w") as f:
            f.write(content)


def _host_line(line):
    fields = line.split() if isinstance(line, str) else []
    return len(fields) >= 2 and "\n" not in line and "#" not in line


def resolve_all(names):
    """Each name looked up, within RESOLVE_SECONDS together (a dead DNS server costs seconds a
    name)."""
    deadline = time.monotonic() + RESOLVE_SECONDS
    found = {}
    for name in names:
        if time.monotonic() > deadline:
            found[name] = {"addresses": [], "error": "not looked up: name service too slow"}
        else:
            found[name] = resolve(name)
    return found


def resolve(name):
    """The addresses `name` resolves to here, as torch looks names up (getaddrinfo)."""
    import socket

    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as exc:
        return {"addresses": [], "error": str(exc)}
    addresses = []
    for info in infos:
        address = info[4][0]
        if address not in addresses:
            addresses.append(address)
    return {"addresses": addresses, "error": None}


def torch_info(pythons):
    """The first python (of those asked) that has torch: its version and whether its
    torchrun takes --local_addr; None when none has it."""
    for python in pythons:
        if "/" not in python and which(python) is None:
            continue
        code, out, _ = run([python, "-c", TORCH_PROBE], timeout=30)
        if code != 0:
            continue
        try:
            found = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            continue
        if isinstance(found, dict):
            found["python"] = python
            found["local_addr"] = bool(found.get("local_addr"))
            return found
    return None


def listen_for(port, seconds, expect):
    """Listen on `port` (every address) until `expect` connections came or `seconds` passed.
    A port already taken (the old run's own store) is reported: the probes reach that."""
    import errno
    import socket

    try:
        sock = _bound(port)
    except OSError as exc:
        in_use = exc.errno == errno.EADDRINUSE
        return {
            "bound": False,
            "in_use": in_use,
            "accepted": 0,
            "error": None if in_use else str(exc),
        }
    accepted = 0
    deadline = time.monotonic() + seconds
    try:
        sock.listen(16)
        while accepted < expect:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            sock.settimeout(left)
            try:
                conn, _ = sock.accept()
            except socket.timeout:
                break
            conn.close()
            accepted += 1
    finally:
        sock.close()
    return {"bound": True, "in_use": False, "accepted": accepted, "error": None}


def _bound(port):
    """A socket bound to `port` on every address: IPv6 and IPv4 together, else IPv4."""
    import socket

    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError:  # no IPv6 in this container
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        address = "0.0.0.0"
    else:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        address = "::"
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
    except OSError:
        sock.close()
        raise
    return sock


def probe_port(address, port, seconds):
    """Connect to address:port, retried until it answers or `seconds` pass."""
    import socket

    started = time.monotonic()
    deadline = started + seconds
    attempts, error = 0, None
    while True:
        attempts += 1
        left = deadline - time.monotonic()
        try:
            conn = socket.create_connection((address, port), timeout=max(0.2, min(2.0, left)))
            conn.close()
            return _probed(True, attempts, started, None)
        except OSError as exc:
            error = str(exc) or type(exc).__name__
        if time.monotonic() + 0.2 >= deadline:
            return _probed(False, attempts, started, error)
        time.sleep(0.2)


def _probed(ok, attempts, started, error):
    return {
        "ok": ok,
        "attempts": attempts,
        "seconds": round(time.monotonic() - started, 3),
        "error": error,
    }
