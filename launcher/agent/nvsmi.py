# mypy: allow-untyped-calls
"""nvidia-smi run the way a real GPU host needs it: bounded in time and bytes, one at a time per
container, its answers kept for the next call, its exit code read as NVML's return code.

Without the persistence daemon on the host each call can take 2-30 s (Azure/aks-gpu#105,
NVIDIA/nvidia-container-toolkit#1053) and a wedged GPU can hang it in the kernel for good
(microsoft/DLWorkspace#951), where even SIGKILL waits. So nvidia-smi never runs under the
agent directly: a small detached runner (RUNNER) runs the asked-for queries one after the
other, each killed after RUN_LIMIT s and cut at its byte limit (RLIMIT_FSIZE on the file its
output goes to), and writes each answer to /run/launcher/gpu/<query>.json. The runner and its
nvidia-smi hold the container's nvidia-smi lock (flock) for as long as either lives: while one
runs, nobody starts another (a hung one is not joined by a new one every poll), and callers read
the last answer there is, with its age.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import subprocess
import sys
import time

from launcher.agent.base import random_hex, which

STATE_DIR = "/run/launcher/gpu"
LOCK_NAME = "nvidia-smi.lock"
RUN_LIMIT = 45.0  # s one nvidia-smi may run before it is killed (slow hosts take up to 30)
ANSWER_LIMIT = 64 * 1024  # bytes of an answer: 8 GPUs' rows take < 1 KB
LOCK_PAUSE = 0.01  # s between two looks at a busy lock
ANSWER_PAUSE = 0.02  # s between two looks for an answer

# The runner, started detached with the lock's descriptor: stdlib only, any python3.
RUNNER = r"""
import json, os, resource, signal, subprocess, sys, time
spec = json.loads(sys.argv[1])
lock = spec["lock_fd"]
for job in spec["jobs"]:
    limit = job["limit"]
    tmp = "%s.%d" % (job["path"], os.getpid())
    def cap(limit=limit):
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    began = time.time()
    with open(tmp + ".out", "wb") as out, open(tmp + ".err", "wb") as err:
        try:
            proc = subprocess.Popen(job["argv"], stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=err, preexec_fn=cap, pass_fds=(lock,))
        except OSError as exc:
            proc, rc = None, 127
            err.write(str(exc).encode())
        if proc is not None:
            try:
                rc = proc.wait(spec["timeout"])
            except subprocess.TimeoutExpired:
                rc = None
                proc.kill()
                proc.wait()  # in the kernel's hands it outlives SIGKILL: the lock stays held
    def read(name, size):
        try:
            with open(tmp + name, "rb") as f:
                data = f.read(size)
            os.unlink(tmp + name)
        except OSError:
            data = b""
        return data.decode("utf-8", "replace")
    out_text = read(".out", limit)
    answer = {"token": spec["token"], "rc": rc, "began": began, "ended": time.time(),
              "out": out_text, "err": read(".err", 4096),
              "cut": rc == -signal.SIGXFSZ or len(out_text.encode()) >= limit}
    with open(tmp + ".json", "w") as f:
        json.dump(answer, f)
    os.replace(tmp + ".json", job["path"])
    if rc is None:
        break
"""


def state_path(state_dir=None):
    """The directory answers and the lock are kept in (STATE_DIR unless told)."""
    return state_dir or STATE_DIR


def answer_path(tail, state_dir=None):
    """Where the last answer to `nvidia-smi TAIL` is kept."""
    state_dir = state_path(state_dir)
    key = hashlib.sha256("\0".join(tail).encode()).hexdigest()[:16]
    return os.path.join(state_dir, "%s.json" % key)


def read_answer(path):
    """The answer kept at `path` ({rc, out, err, began, ended, token, cut}), or None."""
    try:
        with open(path) as f:
            answer = json.load(f)
    except (OSError, ValueError):
        return None
    return answer if isinstance(answer, dict) else None


def lock_holder(state_dir=None):
    """When the nvidia-smi that holds the lock began (time.time()), or None."""
    try:
        with open(os.path.join(state_path(state_dir), LOCK_NAME)) as f:
            return float(json.load(f)["began"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def try_lock(state_dir=None):
    """The lock's descriptor, taken, or None when an nvidia-smi of launcher's runs."""
    state_dir = state_path(state_dir)
    try:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(state_dir, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


class Query:
    """`nvidia-smi TAIL` for each of `tails`, run by one detached runner, one after the other
    (each killed after RUN_LIMIT s), when no other nvidia-smi of launcher's runs in the
    container; `busy_since` otherwise. `timeout`: how long a caller waits for each answer."""

    def __init__(self, tails, timeout=RUN_LIMIT, limits=None, state_dir=None):
        self.tails = [list(t) for t in tails]
        self.state_dir, self.timeout, self.limits = state_dir, timeout, limits or {}
        self.deadline = time.monotonic() + timeout
        self.token = random_hex(12)
        self.began = time.time()
        self.proc = None
        self.busy_since = None
        self.binary = which("nvidia-smi")
        if self.binary:
            self.start(self.limits)

    def start(self, limits):
        fd = try_lock(self.state_dir)
        if fd is None:
            self.busy_since = lock_holder(self.state_dir) or time.time()
            return
        self.busy_since = None
        try:
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps({"began": time.time()}).encode())
            jobs = [
                {"argv": [self.binary, *tail], "path": answer_path(tail, self.state_dir),
                 "limit": limits.get(i, ANSWER_LIMIT)}
                for i, tail in enumerate(self.tails)
            ]  # fmt: skip
            spec = {"jobs": jobs, "token": self.token, "timeout": RUN_LIMIT, "lock_fd": fd}
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", RUNNER, json.dumps(spec)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(fd,),
                start_new_session=True,
            )
        except OSError:
            self.proc = None
        finally:
            os.close(fd)  # the runner's copy holds the lock now

    def wait(self, seconds, i=None):
        """Until the runner is done (or has answered tails[i]); busy, until the other one is
        done; `seconds` at most."""
        end = time.monotonic() + max(0.0, seconds)
        while self.proc is not None and time.monotonic() < end:
            if self.proc.poll() is not None or (i is not None and self.answer(i)):
                return
            time.sleep(ANSWER_PAUSE)
        while self.proc is None and self.busy_since is not None and time.monotonic() < end:
            fd = try_lock(self.state_dir)
            if fd is not None:
                os.close(fd)
                return
            time.sleep(LOCK_PAUSE)

    def done(self):
        return self.proc is not None and self.proc.poll() is not None

    def answer(self, i):
        """This query's own answer to tails[i], or None (not yet, or not run)."""
        found = read_answer(answer_path(self.tails[i], self.state_dir))
        return found if found is not None and found.get("token") == self.token else None

    def latest(self, i):
        """The last answer there is to tails[i], whoever asked, or None."""
        return read_answer(answer_path(self.tails[i], self.state_dir))

    def cancel(self):
        """End the runner and its nvidia-smi (their process group); never waits long."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, 9)
        except OSError:
            pass
        try:
            self.proc.wait(1.0)
        except subprocess.TimeoutExpired:
            pass

    def why_none(self):
        """Why a query has no answer yet: nvidia-smi missing, slow, or someone else's busy."""
        if not self.binary:
            return 127, "nvidia-smi not found"
        if self.proc is None and self.busy_since is not None:
            return 124, "an earlier nvidia-smi has run for %d s and not answered (hung?)" % (
                max(0, time.time() - self.busy_since)
            )
        if self.proc is None:
            return 124, "nvidia-smi could not be started"
        if self.proc.poll() is None:
            return 124, "nvidia-smi has not answered in %.0f s (a slow or hung driver)" % (
                time.time() - self.began
            )
        return 124, "nvidia-smi did not answer within %g s" % (time.time() - self.began)


class Part:
    """One tail of a Query, answered like base.run(): (returncode, stdout, stderr). Waits for
    its answer up to the query's timeout per call before it (they run one after the other); an
    earlier nvidia-smi still running is waited for only while it may yet answer (RUN_LIMIT)."""

    def __init__(self, query, i):
        self.query, self.i = query, i
        self.timeout = query.timeout * (i + 1)
        self.deadline = query.deadline - query.timeout + self.timeout

    def result(self):
        q = self.query
        waiting = q.binary and q.proc is None and q.busy_since is not None
        if waiting and time.time() - q.busy_since < RUN_LIMIT:
            q.wait(self.deadline - time.monotonic())
            q.start(q.limits)  # the lock is free now, or we give up below
        q.wait(self.deadline - time.monotonic(), self.i)
        answer = q.answer(self.i)
        if answer is None:
            rc, why = q.why_none()
            return rc, "", why
        return answer_result(answer)

    def cancel(self):
        self.query.cancel()


def answer_result(answer):
    """(returncode, stdout, stderr) of a kept answer; a cut or timed-out one as an error."""
    if answer.get("rc") is None:
        return 124, "", "nvidia-smi did not answer within %g s (killed)" % RUN_LIMIT
    if answer.get("cut"):
        return 125, "", "nvidia-smi's answer was cut at its size limit (not read)"
    return int(answer["rc"]), str(answer.get("out") or ""), str(answer.get("err") or "")


# --------------------------------------------------------------------------- driver faults

# nvidia-smi exits with NVML's return code (nvmlReturn_t, NVML API reference): what each
# means in a container, and what fixes it.
FAULTS = {
    9: ("no driver", "the NVIDIA driver is not loaded on the host, or /dev/nvidiactl is not "
        "passed to the container", "load it on the host (nvidia-smi there) and pass "
        "/dev/nvidia* to the container"),
    12: ("no NVML", "NVML (libnvidia-ml.so) is not installed in the container",
         "install the host's driver version in the container with --no-kernel-module"),
    15: ("GPU lost", "a GPU fell off the bus or became inaccessible",
         "the host needs a reboot (look for Xid 79 in its dmesg)"),
    17: ("blocked by cgroups", "the container's cgroup does not allow the GPU devices",
         "allow them in the container's config: lxc.cgroup2.devices.allow: c 195:* rwm, and "
         "the nvidia-uvm major (ls -l /dev/nvidia-uvm on the host)"),
    18: ("version mismatch", "the container's NVIDIA user-space driver does not match the "
         "host's kernel module (after a host driver upgrade)", "install the host's driver "
         "version in the container with --no-kernel-module"),
}  # fmt: skip
FAULT_TEXTS = (
    ("Driver/library version mismatch", 18),
    ("couldn't communicate with the NVIDIA driver", 9),
    ("Unable to determine the device handle", 15),
    ("GPU is lost", 15),
    ("NVML Shared Library Not Found", 12),
)
HOST_VERSION_FILE = "/proc/driver/nvidia/version"
BUS_ID = re.compile(r"GPU ?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])")


def fault_code(rc, text):
    """The nvmlReturn_t an nvidia-smi failure stands for (from its message when the exit code
    is not one of FAULTS), or None."""
    if rc in FAULTS:
        return rc
    for needle, code in FAULT_TEXTS:
        if needle in text:
            return code
    return None


def host_driver_version(path=HOST_VERSION_FILE):
    """The host's kernel module version (the container reads the host's /proc/driver)."""
    try:
        with open(path) as f:
            text = f.read(4096)
    except OSError:
        return None
    match = re.search(r"Kernel Module.*?\s(\d+\.\d+(?:\.\d+)?)\s", text)
    return match.group(1) if match else None


def describe_failure(rc, out, err, version_file=HOST_VERSION_FILE):
    """What an nvidia-smi failure means and what to do, in one line; its fault's name."""
    text = (err.strip() + "\n" + out.strip()).strip()
    code = fault_code(rc, text)
    first = text.splitlines()[0][:160] if text else "nvidia-smi exited %d" % rc
    if code is None:
        return None, first
    name, meaning, fix = FAULTS[code]
    detail = meaning
    if code == 18:
        versions = []
        library = re.search(r"NVML library version: (\S+)", text)
        if library:
            versions.append("NVML %s in the container" % library.group(1))
        host = host_driver_version(version_file)
        if host:
            versions.append("kernel module %s on the host" % host)
        detail += " (%s)" % ", ".join(versions) if versions else ""
        fix = fix.replace("the host's driver version", "driver %s" % host) if host else fix
    if code == 15:
        lost = sorted(set(BUS_ID.findall(text)))
        detail += ": %s" % ", ".join("GPU at %s" % b for b in lost) if lost else ""
    return name, "%s: %s; %s (nvidia-smi exit %d: %s)" % (name, detail, fix, rc, first)
