#!/usr/bin/python3
# mypy: allow-untyped-calls
"""Stand-in for Proxmox's `pct`, backed by the sandbox's LXC containers.

Installed as <state_dir>/bin/pct; the state dir is found from this file's location.
Every call appends one line to <state_dir>/pct-calls.log. <state_dir>/faults.json, if
present, injects faults: {"pct_latency": seconds, "partial_push": true, "push_error": "No
space left on device", "keep_env": false} (the last: `pct exec`'s default when --keep-env is not
given, see attach_command).

Verbs: exec, push, pull, status, list, start, stop (the subset launcher uses).
"""

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
    line = json.dumps({"time": round(time.time(), 3), "pid": os.getpid(), "argv": argv})
    with open(os.path.join(STATE_DIR, "pct-calls.log"), "a") as f:
        f.write(line + "\n")


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


def is_running(vmid):
    result = subprocess.run(
        ["lxc-info", "-n", vmid, "-P", LXC_PATH, "-s", "-H"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    return result.stdout.strip() == b"RUNNING"


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


def parse(args, positional, options=()):
    """Split args like Perl's Getopt::Long: named options anywhere, `--` ends options."""
    pos, opts, rest = [], {}, None
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest = args[i + 1 :]
            break
        if arg.startswith("-") and arg != "-":
            name, _, value = arg.lstrip("-").partition("=")
            if name not in options:
                die("Unknown option: %s" % name)
            if not value:
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
    if faults.get("partial_push"):
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
    (vmid,), _, rest = parse(args, ["vmid"])
    if rest:
        die("too many arguments")
    check_vmid(vmid)
    print("status: %s" % ("running" if is_running(vmid) else "stopped"))
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
        print(fmt % (vmid, state, "", hostname(vmid)))
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
       pct status <vmid>
       pct list
       pct start <vmid>
       pct stop <vmid>
"""


def main(argv):
    log_call(argv)
    faults = load_faults()
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
