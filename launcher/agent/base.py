# mypy: allow-untyped-calls
"""What every part of the agent uses: `AgentError`, running a command (now or started
for later), time, hashes and small file helpers."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

from launcher.agent.protocol import ERROR_KINDS

PYTHON_VERSION = "%d.%d.%d" % sys.version_info[:3]  # what platform.python_version() says
MARKER_VAR = "LAUNCHER_RUN"
# `pct exec` gives a minimal PATH; look in the usual places too.
EXTRA_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
COMMAND_VAR = "LAUNCHER_COMMAND"


class AgentError(Exception):
    """An expected failure: becomes the envelope's error, never a traceback."""

    def __init__(self, kind, message, **extra):
        super().__init__(message)
        self.kind = kind if kind in ERROR_KINDS else "failed"
        self.message = message
        self.extra = extra

    def as_dict(self):
        error = {"kind": self.kind, "message": self.message}
        error.update(self.extra)
        return error


# --------------------------------------------------------------------------- the call's clock

# When the host's shell received this call, by the host's clock, read before `pct` ran (the
# agent's last argument: launcher.container.pct.STAMPED_EXEC), so a stalled `pct` or a frozen CT
# delays everything after it but not it. The container shares the host's kernel and so its
# CLOCK_REALTIME: this and time.time() here are one clock, whatever the client's says. main()
# sets it; None (BOOT run by hand, unit tests): the agent's own start stands in for it.
RECEIVED: list[float | None] = [None]
AGENT_STARTED = time.time()


def request_received():
    """When the host received this call (time.time()): never later than now."""
    at = RECEIVED[0]
    return AGENT_STARTED if at is None else min(at, time.time())


def host_stamp(argv):
    """The host's stamp from the agent's argv (`-c`, STAMP), or None when it carries none."""
    try:
        value = float(argv[-1]) if len(argv) > 1 else None
    except ValueError:
        return None
    return value if value is not None and value == value and value > 0 else None


# --------------------------------------------------------------------------- small helpers


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc)


def utc_iso(at=None):
    """`at` (time.time(); default now) as 2026-12-07T12:34:56Z."""
    when = utc_now() if at is None else datetime.datetime.fromtimestamp(at, datetime.timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def random_hex(digits):
    """`digits` random hex digits, for unique temp names and run ids (the uuid module would
    import platform: ~7 ms of every call's start)."""
    return os.urandom((digits + 1) // 2).hex()[:digits]


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_or_none(path):
    try:
        return sha256_file(path)
    except OSError:
        return None


def which(name):
    return shutil.which(name, path=os.environ.get("PATH", "") + ":" + EXTRA_PATH)


def ignore_hangup(signum, frame):
    """SIGHUP's handler while the agent must outlive its client. A handler, not SIG_IGN: an
    ignored signal stays ignored across exec, a caught one is reset to the default, so the
    children (a tmux server started from here, the trainer under it) get the default without a
    preexec_fn, which would make every spawn a full fork (~4 ms each instead of ~1 ms).
    SIGPIPE, which Python ignores, subprocess restores in the child itself."""


def run(argv, timeout=30.0, input=None, env=None):
    """Run argv (no shell); return (returncode, stdout, stderr). A missing binary is rc 127.
    env: the command's whole environment (None: the agent's own)."""
    try:
        proc = subprocess.run(
            argv,
            env=env,
            input=input,
            stdin=subprocess.DEVNULL if input is None else None,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            timeout=timeout,
        )
    except FileNotFoundError as exc:
        return 127, "", str(exc)
    except subprocess.TimeoutExpired:
        return 124, "", "%s timed out after %ss" % (argv[0], timeout)
    out = proc.stdout.decode("utf-8", "replace")
    err = proc.stderr.decode("utf-8", "replace")
    return proc.returncode, out, err


# --------------------------------------------------------------------------- login environment

# `pct exec` keeps the host's environment by default (pve-container src/PVE/CLI/pct.pm: `exec`,
# `--keep-env` defaults to 1, a FIXME announces 0) or clears it (lxc src/lxc/attach.c:
# lxc_attach_set_environment sets PATH and container=lxc only): the agent's own environment is
# the SSH session's on the node (LANG, XDG_RUNTIME_DIR, SSH_*) or nearly nothing. What a run
# gets is neither: what a login in the container starts with (pam_env's locale file, the
# account's HOME and shell, the login shell's profile), the same under both.
LOCALE_FILES = ("/etc/default/locale", "/etc/locale.conf")  # pam_env (Debian), systemd
LOGIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SHELL_OWN = ("PWD", "OLDPWD", "SHLVL", "_")  # the dumping shell's, not the login's
LOGIN_MARK = "launcher-login-env"
LOGIN_TIMEOUT = 10.0
_LOGIN_ENV: list[dict[str, str]] = []  # computed once per agent call


def login_env():
    """The environment a login shell in the container has (a copy)."""
    if not _LOGIN_ENV:
        _LOGIN_ENV.append(read_login_env())
    return dict(_LOGIN_ENV[0])


def account_env():
    """What login(1)/sshd set before the shell starts: the account's HOME, USER, LOGNAME,
    SHELL, a standard PATH, and the locale pam_env reads from the system's locale file."""
    import pwd

    entry = pwd.getpwuid(os.getuid())
    env = {
        "HOME": entry.pw_dir or "/",
        "USER": entry.pw_name,
        "LOGNAME": entry.pw_name,
        "SHELL": entry.pw_shell or "/bin/sh",
        "PATH": LOGIN_PATH,
    }
    env.update(locale_settings())
    return env


def locale_settings():
    for path in LOCALE_FILES:
        try:
            with open(path) as f:
                text = f.read(65536)
        except (OSError, UnicodeDecodeError):
            continue
        found = {}
        for line in text.splitlines():
            key, sep, value = line.strip().partition("=")
            if sep and (key in ("LANG", "LANGUAGE") or key.startswith("LC_")):
                found[key] = value.strip().strip("\"'")
        return found
    return {}


def read_login_env():
    """account_env() passed through the account's login shell (`-l`: /etc/profile, ~/.profile
    and what they source), read back with `env -0`; account_env() alone if that fails."""
    env = account_env()
    shell = env["SHELL"] if os.access(env["SHELL"], os.X_OK) else "/bin/sh"
    home = env["HOME"] if os.path.isdir(env["HOME"]) else "/"
    argv = [shell, "-l", "-c", 'printf "\\n%s\\n" "$0"; exec env -0', LOGIN_MARK]
    try:
        proc = subprocess.run(
            argv, env=env, cwd=home, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, timeout=LOGIN_TIMEOUT,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return env
    mark = ("\n%s\n" % LOGIN_MARK).encode()
    if proc.returncode != 0 or mark not in proc.stdout:
        return env
    found = {}
    for item in proc.stdout.rsplit(mark, 1)[1].split(b"\0"):
        key, sep, value = item.decode("utf-8", "replace").partition("=")
        if sep and key and key not in SHELL_OWN:
            found[key] = value
    return found if "PATH" in found else env


class Started:
    """A command started now and answered later, like run(): its wait overlaps other work.
    Its output must be small (a pipe's worth) or it waits, harmlessly, until read."""

    def __init__(self, argv, timeout=30.0):
        self.argv, self.timeout = argv, timeout
        self.deadline = time.monotonic() + timeout
        self.proc, self.missing = None, ""
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except OSError as exc:
            self.missing = str(exc)

    def result(self):
        """(returncode, stdout, stderr) as run() gives them."""
        if self.proc is None:
            return 127, "", self.missing
        try:
            out, err = self.proc.communicate(timeout=max(0.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.cancel()
            return 124, "", "%s timed out after %ss" % (self.argv[0], self.timeout)
        return self.proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

    def cancel(self):
        """Kill it if it still runs; never waits on its pipes (a child of its could hold them)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


def write_atomic(path, text):
    tmp = path + ".tmp-%d" % os.getpid()
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def remove_quietly(path):
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def list_dir(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


def as_int(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def emit_event(event):
    """One progress event as a JSON line on stderr (the client shows it as it happens); the
    answer itself stays the last line on stdout. A client that went away is no reason to stop."""
    try:
        sys.stderr.write(json.dumps(event) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def new_run_id():
    return "%s-%s" % (utc_now().strftime("%Y%m%dT%H%M%SZ"), random_hex(8))
