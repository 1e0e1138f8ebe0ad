#!/usr/bin/python3
# mypy: allow-untyped-calls
"""Stand-in for Proxmox's `pct`, backed by the sandbox's LXC containers.

Installed as <state_dir>/bin/pct; the state dir is found from this file's location.
Every call appends one line to <state_dir>/pct-calls.log. <state_dir>/faults.json, if
present, injects faults: {"pct_latency": seconds, "partial_push": true, "push_error": "No
space left on device", "keep_env": false, "pct_stall": {"seconds": S, "from": N, "count": C}}.
keep_env: `pct exec`'s default when --keep-env is not given, see attach_command; partial_push
may also be a list of the VMIDs whose pushes it cuts; pct_stall: calls number N to N+C-1,
counted from 0 in pct-calls.log, wait S seconds on the host before doing anything (a `pct` held
up on the host).

A CT's Proxmox config (what /etc/pve/lxc/VMID.conf holds beyond LXC's own) is
<lxcpath>/VMID/pve.conf, `key: value` lines; the sandbox keeps only `lock` there (`pct set
--lock`, `pct unlock`, and `launcher sandbox freeze`, which sets it as vzdump does).

Verbs: exec, push, pull, status [--verbose], config, set --lock, unlock, list, start, stop (the
subset launcher and its tests use).
"""

import fcntl
import json
import os
import subprocess
import sys
import time

STATE_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
LXC_PATH = os.path.join(STATE_DIR, "lxc")
CONTAINER_PATH = "/sbin:/bin:/usr/sbin:/usr/bin"
LXC_ATTACH = "/usr/bin/lxc-attach"
NODE = "sandbox"

# Runs inside the container: argv = DST MODE USER GROUP ("" when not given), content on stdin.
# As pve-container's `create_file` (src/PVE/CLI/pct.pm): a new file is created with mode 0 and
# given its mode afterwards (0666 & ~umask when none was asked); an existing one is truncated
# and keeps its owner unless --user/--group say otherwise.
PUSH_SCRIPT = r"""
import os, shutil, sys
dst, mode, user, group = sys.argv[1:5]
try:
    try:
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0)
        if not mode:
            mask = os.umask(0)
            os.umask(mask)
            mode = str(0o666 & ~mask)
    except FileExistsError:
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
except OSError as exc:
    sys.stderr.write("failed to create file: %s: %s\n" % (dst, exc.strerror))
    sys.exit(1)
with os.fdopen(fd, "wb") as out:
    if mode:
        os.fchmod(out.fileno(), int(mode))
    if user or group:
        import grp, pwd
        st = os.fstat(out.fileno())
        uid = int(user) if user.isdigit() else pwd.getpwnam(user).pw_uid if user else st.st_uid
        gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid if group else st.st_gid
        os.fchown(out.fileno(), uid, gid)
    shutil.copyfileobj(sys.stdin.buffer, out)
"""

PULL_SCRIPT = r"""
import shutil, sys
try:
    src = open(sys.argv[1], "rb")
except OSError as exc:
    sys.stderr.write("failed to open %s for reading: %s\n" % (sys.argv[1], exc.strerror))
    sys.exit(1)
with src:
    shutil.copyfileobj(src, sys.stdout.buffer)
"""


class PctError(Exception):
    pass


def die(message):
    raise PctError(message)


def log_call(argv):
    """Append this call to pct-calls.log; its number there (counted from 0)."""
    line = json.dumps({"time": round(time.time(), 3), "pid": os.getpid(), "argv": argv})
    with open(os.path.join(STATE_DIR, "pct-calls.log"), "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # concurrent calls get numbers of their own
        f.seek(0)
        number = sum(1 for _ in f)
        f.write(line + "\n")
    return number


def stall(faults, number):
    """The host-side stall: this call waits before doing anything, as a `pct` held up on the
    host does (a busy pmxcfs, a slow storage probe), so the host's shell has already stamped
    the request (launcher.container.pct.STAMPED_EXEC) when the container sees it much later."""
    spec = faults.get("pct_stall")
    if not isinstance(spec, dict):
        return
    first = int(spec.get("from", 0))
    if first <= number < first + int(spec.get("count", 1)):
        time.sleep(float(spec.get("seconds", 0)))


def load_faults():
    try:
        with open(os.path.join(STATE_DIR, "faults.json")) as f:
            faults = json.load(f)
    except (OSError, ValueError):
        return {}
    return faults if isinstance(faults, dict) else {}


def vmids():
    try:
        names = os.listdir(LXC_PATH)
    except OSError:
        return []
    return sorted(
        int(n) for n in names if n.isdigit() and os.path.isfile(os.path.join(LXC_PATH, n, "config"))
    )


def check_vmid(vmid):
    if not vmid.isdigit() or int(vmid) < 100:
        die("value '%s' does not look like a valid VM ID" % vmid)
    if not os.path.isfile(os.path.join(LXC_PATH, vmid, "config")):
        die("Configuration file 'nodes/%s/lxc/%s.conf' does not exist" % (NODE, vmid))


# LXC's states of a running container. A frozen CT runs as far as Proxmox is concerned:
# `check_running` asks whether its LXC monitor answers (pve-container src/PVE/LXC.pm,
# `check_running` → `list_active_containers`), not whether its processes are thawed; so `pct
# exec` on a frozen CT does not refuse, it hangs (lxc-attach joins the frozen cgroup).
RUNNING_STATES = (b"RUNNING", b"FROZEN", b"FREEZING", b"THAWED")


def lxc_state(vmid, what="-s"):
    result = subprocess.run(
        ["lxc-info", "-n", vmid, "-P", LXC_PATH, what, "-H"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    return result.stdout.strip()


def is_running(vmid):
    return lxc_state(vmid) in RUNNING_STATES


def pve_config_path(vmid):
    return os.path.join(LXC_PATH, vmid, "pve.conf")


def pve_config(vmid):
    """The CT's Proxmox config lines as a dict (here: its lock, if set)."""
    found = {}
    try:
        with open(pve_config_path(vmid)) as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and value.strip():
                    found[key.strip()] = value.strip()
    except OSError:
        pass
    return found


def write_pve_config(vmid, config):
    path = pve_config_path(vmid)
    with open(path + ".tmp", "w") as f:
        f.write("".join("%s: %s\n" % (k, v) for k, v in sorted(config.items())))
    os.replace(path + ".tmp", path)


def check_running(vmid):
    check_vmid(vmid)
    if not is_running(vmid):
        die("container '%s' not running!" % vmid)


def hostname(vmid):
    try:
        with open(os.path.join(LXC_PATH, vmid, "config")) as f:
            for line in f:
                key, _, value = line.partition("=")
                if key.strip() == "lxc.uts.name":
                    return value.strip()
    except OSError:
        pass
    return "CT" + vmid


def parse_vmid(args, options=(), flags=()):
    """(VMID, options) of a command that takes nothing after them."""
    (vmid,), opts, rest = parse(args, ["vmid"], options, flags)
    if rest:
        die("too many arguments")
    check_vmid(vmid)
    return vmid, opts


def parse(args, positional, options=(), flags=()):
    """Split args like Perl's Getopt::Long: named options anywhere, `--` ends options. A boolean
    (`flags`) takes an optional value, as pve-common's JSONSchema `get_options` declares them
    (`name:s`): `--verbose` alone is true."""
    pos, opts, rest = [], {}, None
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest = args[i + 1 :]
            break
        if arg.startswith("-") and arg != "-":
            name, _, value = arg.lstrip("-").partition("=")
            if name not in options and name not in flags:
                die("Unknown option: %s" % name)
            if not value and name in flags:
                following = args[i + 1] if i + 1 < len(args) else ""
                value = following if following in ("0", "1") else "1"
                i += following in ("0", "1")
            elif not value:
                if i + 1 >= len(args):
                    die("Option %s requires an argument" % name)
                i += 1
                value = args[i]
            opts[name] = value
        else:
            pos.append(arg)
        i += 1
    if rest is None:
        rest = pos[len(positional) :]
        pos = pos[: len(positional)]
    if len(pos) < len(positional):
        die("not enough arguments (need %s)" % ", ".join("<%s>" % p for p in positional))
    return pos, opts, rest


def attach_command(vmid, argv, keep_env=True):
    """lxc-attach argv (no shell added) and environment, as pve-container's `exec` builds them
    (src/PVE/CLI/pct.pm): pct runs with PATH=/sbin:/bin:/usr/sbin:/usr/bin (pve-common
    src/PVE/CLIHandler.pm: run_cli_handler), drops SSL_CERT_FILE and SSL_CERT_DIR
    (clean_environment), then hands lxc-attach --keep-env (the caller's environment goes in)
    or --clear-env (lxc-attach keeps nothing but sets PATH and container=lxc: lxc
    src/lxc/attach.c, lxc_attach_set_environment)."""
    env = dict(os.environ)
    env["PATH"] = CONTAINER_PATH
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
        env.pop(name, None)
    mode = "--keep-env" if keep_env else "--clear-env"
    return [LXC_ATTACH, "-n", vmid, "-P", LXC_PATH, mode, "--", *argv], env


def attach(vmid, argv, **kwargs):
    cmd, env = attach_command(vmid, argv)
    return subprocess.run(cmd, env=env, check=False, **kwargs)


def cmd_exec(args, faults):
    """`--keep-env` defaults to 1 today ("FIXME: switch to default 0 with pve 9"); the
    sandbox's default is the faults' keep_env, so both kinds of node can be tried."""
    (vmid,), opts, rest = parse(args, ["vmid"], ("keep-env",))
    keep = opts.get("keep-env", "1" if faults.get("keep_env", True) else "0")
    if keep not in ("0", "1"):
        die("invalid value for keep-env: '%s'" % keep)
    check_running(vmid)
    if not rest:
        die("missing command")
    sys.stdout.flush()
    cmd, env = attach_command(vmid, rest, keep_env=keep == "1")
    os.execve(LXC_ATTACH, cmd, env)


def cmd_push(args, faults):
    """As pve-container's `push` (src/PVE/CLI/pct.pm): the write runs as a PVE task
    (`fork_worker`). In the CLI a failed task only prints its error on stderr (pve-common
    src/PVE/RESTEnvironment.pm: `TASK ERROR: …` -> `print STDERR`), `push` has no exit handler in
    `$cmddef` and `run_cli_handler` ends with `exit 0` (src/PVE/CLIHandler.pm): so a write that
    fails still exits 0. Only what dies before the task (not running, bad arguments) exits
    non-zero."""
    (vmid, src, dst), opts, rest = parse(
        args, ["vmid", "file", "destination"], ("perms", "user", "group")
    )
    if rest:
        die("too many arguments")
    check_vmid(vmid)
    if not is_running(vmid):
        die("can only push files to a running CT")
    perms = opts.get("perms")
    mode = ""
    if perms is not None:
        perms = perms if perms.startswith("0") else "0" + perms  # octal by default, as pct
        try:
            mode = str(int(perms, 16) if perms.lower().startswith("0x") else int(perms, 8))
        except ValueError:
            die("invalid mode: '%s'" % perms)
    return push_task(vmid, src, dst, mode, opts, faults)


def push_task(vmid, src, dst, mode, opts, faults):
    """The task's part: its error goes to stderr, and pct still exits 0."""
    try:
        with open(src, "rb") as f:
            data = f.read()
    except OSError:
        return task_error("failed to open %s for reading" % src)
    partial = faults.get("partial_push")
    if partial is True or (isinstance(partial, list) and vmid in [str(v) for v in partial]):
        data = data[: len(data) // 2]
    if faults.get("push_error"):
        return task_error("failed to create file: %s: %s" % (dst, faults["push_error"]))
    argv = ["python3", "-I", "-S", "-c", PUSH_SCRIPT, dst, mode]
    argv += [opts.get("user", ""), opts.get("group", "")]
    result = attach(vmid, argv, input=data, stderr=subprocess.PIPE)
    if result.returncode != 0:
        return task_error(result.stderr.decode(errors="replace").strip() or "push failed")
    return 0


def task_error(message):
    sys.stderr.write("%s\n" % " ".join(message.splitlines()))
    return 0


def cmd_pull(args):
    (vmid, src, dst), _, rest = parse(
        args, ["vmid", "path", "destination"], ("perms", "user", "group")
    )
    if rest:
        die("too many arguments")
    check_running(vmid)
    argv = ["python3", "-I", "-S", "-c", PULL_SCRIPT, src]
    result = attach(vmid, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if result.returncode != 0:
        die(result.stderr.decode(errors="replace").strip() or "pull failed")
    try:
        with open(dst, "wb") as f:
            f.write(result.stdout)
    except OSError as exc:
        die("failed to open %s for writing: %s" % (dst, exc.strerror))
    return 0


def cmd_status(args):
    """`status: running`; with --verbose, as pve-container's `vmstatus` sees the CT, sorted
    (src/PVE/CLI/pct.pm, `status`): among them `lock` (copied from the config) and `pid` (the
    CT's init, a host PID), not whether it is frozen."""
    vmid, opts = parse_vmid(args, flags=("verbose",))
    running = is_running(vmid)
    stat = {"status": "running" if running else "stopped"}
    if opts.get("verbose") == "1":
        stat.update({"vmid": vmid, "name": hostname(vmid), "type": "lxc"})
        lock = pve_config(vmid).get("lock")
        if lock:
            stat["lock"] = lock
        pid = lxc_state(vmid, "-p").decode() if running else ""
        if pid.isdigit():
            stat["pid"] = pid
    for key in sorted(stat):
        print("%s: %s" % (key, stat[key]))
    return 0


def cmd_config(args):
    """The CT's config as `pct config` prints it (the few keys the sandbox has)."""
    vmid, _ = parse_vmid(args)
    config = {"arch": "amd64", "hostname": hostname(vmid), "ostype": "debian"}
    config.update(pve_config(vmid))
    for key in sorted(config):
        print("%s: %s" % (key, config[key]))
    return 0


LOCKS = (
    "backup",
    "create",
    "destroyed",
    "disk",
    "fstrim",
    "migrate",
    "mounted",
    "rollback",
    "snapshot",
    "snapshot-delete",
)  # fmt: skip  (pve-container src/PVE/LXC/Config.pm)


def cmd_set(args):
    """`pct set VMID --lock NAME`: the only option the sandbox keeps."""
    vmid, opts = parse_vmid(args, ("lock",))
    if "lock" in opts:
        if opts["lock"] not in LOCKS:
            die("lock: value '%s' does not have a value in the enumeration '%s'"
                % (opts["lock"], ", ".join(LOCKS)))  # fmt: skip
        config = pve_config(vmid)
        config["lock"] = opts["lock"]
        write_pve_config(vmid, config)
    return 0


def cmd_unlock(args):
    vmid, _ = parse_vmid(args)
    config = pve_config(vmid)
    config.pop("lock", None)
    write_pve_config(vmid, config)
    return 0


def cmd_list(args):
    _, _, rest = parse(args, [])
    if rest:
        die("too many arguments")
    rows = [(str(v), "running" if is_running(str(v)) else "stopped") for v in vmids()]
    if not rows:
        return 0
    fmt = "%-10s %-10s %-12s %-20s"
    print(fmt % ("VMID", "Status", "Lock", "Name"))
    for vmid, state in rows:
        print(fmt % (vmid, state, pve_config(vmid).get("lock", ""), hostname(vmid)))
    return 0


def cmd_start(args):
    (vmid,), _, _ = parse(args, ["vmid"])
    check_vmid(vmid)
    if is_running(vmid):
        die("CT %s already running" % vmid)
    result = subprocess.run(["lxc-start", "-n", vmid, "-P", LXC_PATH, "-d"], check=False)
    if result.returncode != 0:
        die("startup for container '%s' failed" % vmid)
    return 0


def cmd_stop(args):
    (vmid,), _, _ = parse(args, ["vmid"])
    check_vmid(vmid)
    if not is_running(vmid):
        die("CT %s not running" % vmid)
    subprocess.run(["lxc-stop", "-n", vmid, "-P", LXC_PATH, "-k"], check=False)
    return 0


USAGE = """USAGE: pct <COMMAND> [ARGS] [OPTIONS]
       pct exec <vmid> [<extra-args>] [--keep-env 0|1]
       pct push <vmid> <file> <destination> [--perms MODE] [--user U] [--group G]
       pct pull <vmid> <path> <destination>
       pct status <vmid> [--verbose]
       pct config <vmid>
       pct set <vmid> --lock <lock>
       pct unlock <vmid>
       pct list
       pct start <vmid>
       pct stop <vmid>
"""


def main(argv):
    number = log_call(argv)
    faults = load_faults()
    stall(faults, number)
    latency = faults.get("pct_latency") or 0
    if latency > 0:
        time.sleep(float(latency))
    if not argv or argv[0] in ("help", "-h", "--help"):
        sys.stdout.write(USAGE)
        return 0 if argv else 255
    verb, args = argv[0], argv[1:]
    handlers = {
        "exec": lambda a: cmd_exec(a, faults),
        "push": lambda a: cmd_push(a, faults),
        "pull": cmd_pull,
        "status": cmd_status,
        "config": cmd_config,
        "set": cmd_set,
        "unlock": cmd_unlock,
        "list": cmd_list,
        "start": cmd_start,
        "stop": cmd_stop,
    }
    if verb not in handlers:
        sys.stderr.write("ERROR: unknown command 'pct %s'\n%s" % (verb, USAGE))
        return 255
    try:
        return handlers[verb](args)
    except PctError as exc:
        sys.stderr.write("%s\n" % exc)
        return 255


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
