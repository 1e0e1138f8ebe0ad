#!/usr/bin/env python3
# mypy: allow-untyped-calls
"""Demo trainer for the launcher sandbox: prints DFlash-style status lines, holds GPUs.

Run inside a sandbox container, usually in tmux:  python3 train_demo.py

Environment:
  DEMO_MODE              healthy (default) | crash | stall | flat | nan | silent
  DEMO_INTERVAL          seconds between status lines (default 1.0)
  DEMO_RAMP              seconds for queues and throughput to reach the plateau (default 8)
  DEMO_CHECKPOINT_EVERY  write checkpoints/step_<N>.pt every N steps (default 5; 0 = never)
  DEMO_SAVE_SECONDS      each checkpoint save takes this long, printing nothing and writing
                         the file a piece at a time, as a large state dict's does (default 0)
  DEMO_GPUS              how many GPUs to use (default: all it can see)
  DEMO_GPU_INDEXES       which GPUs to use, by index, e.g. 3 or 0,1 (default: the first
                         DEMO_GPUS). It sees those CUDA_VISIBLE_DEVICES names (indexes or
                         GPU-… UUIDs; as CUDA, the list ends at the first it cannot resolve),
                         else all of the container's. Using GPUs is what CUDA does: holding
                         /dev/nvidiactl, /dev/nvidia-uvm and /dev/nvidia<minor> of each (the
                         minor, not the index: a container given the host's GPUs 6 and 7 sees
                         index 0 and 1 as /dev/nvidia6 and /dev/nvidia7)
  DEMO_GPU_MONITOR=1     start a GPU monitor child, as wandb's system monitor does: it opens
                         every /dev/nvidia* (NVML) and no /dev/nvidia-uvm (no CUDA context)
  DEMO_CRASH_AFTER       crash: seconds before a RuntimeError traceback, exit 1 (default 5)
  DEMO_STALL_AFTER       stall: seconds before queues drain and steps stop (default 5)
  DEMO_NAN_AFTER         nan: seconds before the loss becomes nan (default 5)
  DEMO_SPAWN_CHILD=1     spawn a "dataloader worker" that ignores SIGHUP, SIGINT and SIGTERM
                         and keeps the GPUs' device files open, so killing only the tmux
                         session leaves it behind
  DEMO_IGNORE_SIGINT=1   ignore C-c (SIGINT)
  DEMO_STEPS             finish after this many steps: "Training completed.", exit 0 (default:
                         never), as a trainer does after its last epoch
  DEMO_LOAD_SECONDS      print "Loading model..." and nothing else for this long before the
                         first status line, as a large model's load does (default 0)
  DEMO_HF_BAR=0          hf format without the progress bar (disable_tqdm=True): dicts only
  DEMO_FORMAT            how status is printed: dflash (default) | hf | jsonl | pipes
                           hf     a Hugging Face Trainer: a tqdm-style bar redrawn with \r
                                  (step, it/s) and dicts written above it, e.g.
                                  {'loss': 2.1, 'grad_norm': 1.2, 'learning_rate': 6e-04, ...}
                           jsonl  one JSON object a line: step, loss, lr, throughput.tokens_per_s,
                                  queues.q_pre, queues.q_hs, elapsed_s (loss nan prints NaN)
                           pipes  a trainer of its own shape, `key value | key value`, the
                                  prefetch queue as a fill: step 317 | loss 2.04 |
                                  tok/s 50676 | q_pre 13/16 | q_post 3/16

modes:
  healthy  queues fill, throughput climbs to ~28 Ktok/s, loss falls, checkpoints appear
  crash    a real Python traceback after DEMO_CRASH_AFTER seconds, exit status 1
  stall    after DEMO_STALL_AFTER seconds: queues drain to 0, 0 Ktok/s, step stops; keeps printing
  flat     throughput stays around 0.5 Ktok/s
  nan      loss becomes nan after DEMO_NAN_AFTER seconds
  silent   prints nothing at all, just sleeps
  crashloop  resumes from the newest checkpoint, is SIGKILLed after DEMO_CRASH_AFTER seconds;
             run it in a shell loop (`while true; do python3 train_demo.py; done`)
  diverge  after DEMO_DIVERGE_AFTER seconds (default 5) the loss jumps to ~ln(32000) and stays
  sag      after DEMO_SAG_AFTER seconds (default 5) throughput drops to a quarter and stays
  finalizer-noise  healthy, but prints DataLoader finaliser tracebacks every few seconds
  nan-gradnorm     prints grad_norm=, which becomes nan after DEMO_NAN_AFTER seconds
  bursty   the last q_pre bucket is filled in one status line out of three
  hang     after DEMO_HANG_AFTER seconds (default 5) prints nothing more, the pane alive
  cpu-fallback  healthy status lines, but holds no GPU (CUDA was not found: ran on the CPU)
  one-gpu       healthy status lines from one GPU of those given
  idle-gpus     holds every GPU, healthy status lines, 0 % utilization (input-starved)
  DEMO_RESUME=1 (any mode) resumes from the newest checkpoint in checkpoints/

Checkpoints go to $LAUNCHER_CHECKPOINTS (what launcher tells every run) or ./checkpoints.

On SIGINT it prints "Interrupted; saving checkpoint..." and exits 130.
"""

import atexit
import json
import math
import os
import random
import signal
import sys
import time

DRIVER_DIR = "/var/lib/sandbox-gpu"  # the sandbox's driver (launcher/sandbox/gpus.py)
MEMORY_PER_GPU_MIB = 22512
BUSY_UTIL = 97  # % a compute-bound trainer shows at full throughput
RELEASE_LAG = 0.5  # s the driver takes to free an exited process's memory
MODES = ("healthy", "crash", "stall", "flat", "nan", "silent")
GPU_MODES = ("cpu-fallback", "one-gpu", "idle-gpus")
FORMATS = ("dflash", "hf", "jsonl", "pipes")
PLATEAU_KTOK = 28.0
FLAT_KTOK = 0.5
TOKENS_PER_STEP = 14000.0
TOTAL_STEPS = 2000000
QUEUE_TARGET = [8, 7, 6, 6, 5, 4]
QUEUE_DEPTH = 16  # the pipes format's prefetch queue capacity
HS_TARGET = 4
# Misbehaviours the verdict tests need (see misbehave() and the functions after it).
MISBEHAVIOURS = ("crashloop", "diverge", "sag", "finalizer-noise", "nan-gradnorm", "bursty")
MISBEHAVIOURS += ("hang",)  # type: ignore[assignment]  # pane alive, nothing printed
MODES = MODES + MISBEHAVIOURS + GPU_MODES  # type: ignore[assignment]  # one tuple, grown
DIVERGED_LOSS = math.log(32000)  # a model that predicts nothing, with a 32k vocabulary


def env_float(name, default):
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return float(default)


def env_int(name, default):
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return int(default)


MINORS_FILE = "/etc/sandbox-gpu-minors"  # the container's slice (launcher/sandbox/gpus.py)


def container_minors():
    """The minors of the container's GPUs in index order: the sandbox's slice, else the
    /dev/nvidia<N> files there are."""
    try:
        with open(MINORS_FILE) as f:
            text = f.read().strip()
        if text:
            return sorted(int(m) for m in text.split(","))
    except (OSError, ValueError):
        pass
    try:
        return sorted(int(n[6:]) for n in os.listdir("/dev") if is_gpu_file(n))
    except OSError:
        return []


def is_gpu_file(name):
    return name.startswith("nvidia") and name[6:].isdigit()


def gpu_pool():
    """Which pool of the sandbox's GPUs this container uses (default `host`)."""
    try:
        with open("/etc/sandbox-gpu-pool") as f:
            return f.read().strip() or "host"
    except OSError:
        return "host"


def gpu_uuid(minor):
    """The UUID the sandbox's nvidia-smi gives the GPU (launcher/sandbox/nvidia_smi.py)."""
    import uuid

    name = "sandbox-gpu:%s:%d" % (gpu_pool(), minor)
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, name))


def visible_minors():
    """The GPUs CUDA lets this process see, as minors in CUDA's order: CUDA_VISIBLE_DEVICES
    names them by index or UUID (prefix), and the list ends at the first name that resolves
    to no GPU (CUDA's documented behaviour); unset, all of the container's."""
    minors = container_minors()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return minors
    found = []
    for entry in (e.strip() for e in visible.split(",")):
        if entry.isdigit() and int(entry) < len(minors):
            found.append(minors[int(entry)])
            continue
        matches = [m for m in minors if entry.startswith("GPU-") and gpu_uuid(m).startswith(entry)]
        if len(matches) != 1:
            break
        found.append(matches[0])
    return found


def open_gpus(limit=None):
    """Use GPUs as CUDA does: /dev/nvidiactl, /dev/nvidia-uvm and the device file (by minor
    number) of each GPU it has a context on, held for the process's life."""
    minors = visible_minors()
    if limit is not None:
        minors = minors[:limit]
    wanted = os.environ.get("DEMO_GPU_INDEXES")
    if wanted:
        picked = [int(i) for i in wanted.split(",") if i.strip().isdigit()]
        minors = [visible_minors()[i] for i in picked if i < len(visible_minors())]
    if not minors:
        return []
    names = ["nvidiactl", "nvidia-uvm"] + ["nvidia%d" % m for m in minors]
    paths = [os.path.join("/dev", n) for n in names]
    return [open(p, "rb") for p in paths if os.path.exists(p)]


MONITOR = """
import os, time
parent = os.getppid()
files = []
for name in sorted(os.listdir("/dev")):
    if name.startswith("nvidia") and name != "nvidia-uvm":
        files.append(open("/dev/" + name, "rb"))
while os.getppid() == parent:
    time.sleep(0.5)
"""


def start_monitor():
    """A GPU monitor child (wandb's, pynvml's): NVML opens every /dev/nvidia* it can see and
    creates no CUDA context (no /dev/nvidia-uvm). It inherits none of our handles and ends
    when we do."""
    import subprocess

    return subprocess.Popen(
        [sys.executable, "-c", MONITOR, "gpu-monitor"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def start_time(proc, pid):
    try:
        with open("%s/%s/stat" % (proc, pid)) as f:
            return f.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return None


def host_pid():
    """This process's PID on the host, found in the host's /proc the sandbox's driver shares:
    the NSpid line whose last entry is our PID, with our start time."""
    mine, start = os.getpid(), start_time("/proc", "self")
    try:
        entries = os.listdir(DRIVER_DIR + "/hostproc")
    except OSError:
        return None
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open("%s/hostproc/%s/status" % (DRIVER_DIR, entry)) as f:
                nspid = [line for line in f if line.startswith("NSpid:")]
        except OSError:
            continue
        ours = nspid and nspid[0].split()[-1] == str(mine)
        if ours and start_time(DRIVER_DIR + "/hostproc", entry) == start:
            return int(entry)
    return None


class GpuUse:
    """What this process does on its GPUs, told to the sandbox's driver (its nvidia-smi shows
    memory and utilization from it, in every container sharing the GPUs)."""

    def __init__(self, files):
        self.files = files
        names = [os.path.basename(f.name) for f in files]
        self.devices = [int(n[6:]) for n in names if is_gpu_file(n)]
        self.util = None
        self.path = None
        self.record = None
        pid = host_pid() if self.devices else None
        if pid is None:
            return
        self.path = os.path.join(DRIVER_DIR, "pools", gpu_pool(), "%d.json" % pid)
        self.record = {"pid": os.getpid(), "host_pid": pid, "start": start_time("/proc", "self")}
        self.report(0)
        atexit.register(self.release)

    def report(self, util, released_at=None):
        util = int(max(0, min(100, util)))
        if self.path is None or self.record is None:
            return
        if util == self.util and released_at is None:
            return
        self.util = util
        record = dict(self.record, released_at=released_at)
        record["devices"] = {str(d): [util, MEMORY_PER_GPU_MIB] for d in self.devices}
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(self.path + ".tmp", "w") as f:
                json.dump(record, f)
            os.replace(self.path + ".tmp", self.path)
        except OSError:
            pass

    def release(self):
        self.report(0, released_at=time.time() + RELEASE_LAG)


def spawn_child():
    """Fork a worker that shrugs off SIGHUP, SIGINT and SIGTERM and holds a GPU file."""
    pid = os.fork()
    if pid:
        return pid
    for signum in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    # The parent's device handles stay open in the fork, as a DataLoader worker's do.
    try:
        while True:
            time.sleep(3600)
    finally:
        os._exit(0)


def fmt_eta(seconds):
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "???"
    if seconds >= 86400:
        return "%.1fd" % (seconds / 86400)
    if seconds >= 3600:
        return "%.1fh" % (seconds / 3600)
    if seconds >= 60:
        return "%.1fm" % (seconds / 60)
    return "%.0fs" % seconds


def fmt_list(values):
    return "[" + ", ".join(str(v) for v in values) + "]"


class Trainer:
    def __init__(self, mode, interval, ramp):
        self.mode = mode
        self.interval = interval
        self.ramp = max(ramp, 0.1)
        self.start = time.time()
        self.step = 0
        self.tokens = 0.0
        self.loss = None
        self.last_checkpoint = 0
        self.rng = random.Random(1234)
        self.checkpoint_every = env_int("DEMO_CHECKPOINT_EVERY", 5)
        self.stall_after = env_float("DEMO_STALL_AFTER", 5)
        self.nan_after = env_float("DEMO_NAN_AFTER", 5)
        self.crash_after = env_float("DEMO_CRASH_AFTER", 5)

    def elapsed(self):
        return time.time() - self.start

    def stalled(self, t):
        return self.mode == "stall" and t >= self.stall_after

    def progress(self, t):
        """0 -> 1 over the ramp, smooth."""
        return 1.0 - math.exp(-4.0 * t / self.ramp)

    def throughput(self, t):
        if self.stalled(t):
            return 0.0
        if self.mode == "flat":
            return max(0.0, FLAT_KTOK + self.rng.uniform(-0.05, 0.05))
        p = self.progress(t)
        if p < 0.05:
            return 0.0
        return max(0.0, PLATEAU_KTOK * p * (1.0 + self.rng.uniform(-0.03, 0.03)))

    def queues(self, t):
        if self.stalled(t):
            return [0] * len(QUEUE_TARGET), [0]
        fill = min(1.0, 2.0 * t / self.ramp)
        q_pre = [
            max(0, min(q, round(q * fill) + self.rng.choice((-1, 0, 0, 1)))) for q in QUEUE_TARGET
        ]
        q_hs = [max(0, min(HS_TARGET, round(HS_TARGET * fill) + self.rng.choice((-1, 0, 0))))]
        return q_pre, q_hs

    def advance(self, t, ktok):
        if self.stalled(t):
            return
        self.tokens += ktok * 1000.0 * self.interval
        steps = int(self.tokens // TOKENS_PER_STEP) - self.step
        if self.step == 0 and ktok > 0 and steps <= 0:
            steps = 1
        if steps > 0:
            self.step += steps
        if self.step > 0:
            self.loss = 2.0 + 4.5 * math.exp(-self.step / 60.0) + self.rng.uniform(-0.05, 0.05)
            if self.mode == "nan" and t >= self.nan_after:
                self.loss = float("nan")

    def checkpoint(self):
        if self.checkpoint_every <= 0 or self.step < self.last_checkpoint + self.checkpoint_every:
            return
        n = self.step - self.step % self.checkpoint_every
        os.makedirs(checkpoints_dir(), exist_ok=True)
        path = os.path.join(checkpoints_dir(), "step_%d.pt" % n)
        with open(path + ".tmp", "wb") as f:
            f.write(b"demo checkpoint step=%d\n" % n)
            # A large save: nothing printed, the file written a piece at a time.
            end = time.time() + env_float("DEMO_SAVE_SECONDS", 0)
            while time.time() < end:
                f.write(b"\0" * 4096)
                f.flush()
                time.sleep(0.2)
        os.replace(path + ".tmp", path)
        self.last_checkpoint = n

    def line(self, t, ktok):
        q_pre, q_hs = self.queues(t)
        q_pre = bursty(self, q_pre)
        if self.loss is None:
            stats = "loss=--- acc=--- streak=--- lr=---"
            eta = None
        else:
            acc = 0.0 if self.loss != self.loss else max(0.0, min(0.95, (6.5 - self.loss) / 5.0))
            streak = acc * 4.0
            lr = 6e-4 * min(1.0, self.step / 200.0) if self.step else 0.0
            loss = "nan" if self.loss != self.loss else "%.4f" % self.loss
            stats = "loss=%s acc=%.3f streak=%.1f lr=%.2e" % (loss, acc, streak, lr)
            stats += grad_norm_field(self, t)
            steps_per_s = ktok * 1000.0 / TOKENS_PER_STEP
            eta = (TOTAL_STEPS - self.step) / steps_per_s if steps_per_s > 0 else None
        tgt = ktok / 6.3
        dft = ktok / 38.0
        epoch = self.step / float(TOTAL_STEPS)
        return (
            "[%dm] step=%d %s noise=0.1000 | tgt=%.2fb/s dft=%.2fb/s (%.1fKtok/s) | "
            "q_pre=%s q_hs=%s | epoch~%.2f ETA=%s"
            % (
                int(t // 60),
                self.step,
                stats,
                tgt,
                dft,
                ktok,
                fmt_list(q_pre),
                fmt_list(q_hs),
                epoch,
                fmt_eta(eta),
            )
        )

    def tick(self):
        t = self.elapsed()
        if self.mode == "crash" and t >= self.crash_after:
            self.forward_backward()
        ktok = misbehave(self, t, self.throughput(t))
        if Output.gpus is not None:  # busy as far as it gets through its tokens
            busy = 0.0 if self.mode == "idle-gpus" else min(1.0, ktok / PLATEAU_KTOK)
            Output.gpus.report(BUSY_UTIL * busy)
        self.advance(t, ktok)
        diverge(self, t)
        self.checkpoint()
        EMIT[Output.format](self, t, ktok)

    def forward_backward(self):
        return self.all_reduce(self.step)

    def all_reduce(self, step):
        raise RuntimeError("NCCL error: unhandled cuda error at step %d (demo crash)" % step)


# --- output formats (DEMO_FORMAT) ------------------------------------------------------------


class Output:
    """The chosen format, and the hf format's bar and last logged step."""

    format = "dflash"
    gpus: "GpuUse | None" = None  # the GPUs held, and what they do
    bar = ""
    logged = 0


def emit_dflash(trainer, t, ktok):
    print(trainer.line(t, ktok), flush=True)


def fmt_clock(seconds):
    """tqdm's format_interval: MM:SS, or H:MM:SS past an hour."""
    seconds = int(seconds)
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return "%d:%02d:%02d" % (hours, minutes, secs)
    return "%02d:%02d" % (minutes, secs)


def hf_bar(step, t, steps_per_s):
    """The training bar as tqdm draws it: ` 10%|█         | 200/2000 [00:33<04:58,  6.04it/s]`."""
    total = TOTAL_STEPS
    filled = step * 10 // total
    if steps_per_s <= 0:
        left, rate = "?", "?it/s"
    else:
        left = fmt_clock((total - step) / steps_per_s)
        fast = steps_per_s >= 1  # tqdm shows s/it below one iteration a second
        rate = "%5.2fit/s" % steps_per_s if fast else "%5.2fs/it" % (1.0 / steps_per_s)
    return "%3d%%|%s%s| %d/%d [%s<%s, %s]" % (
        step * 100 // total,
        "\u2588" * filled,
        " " * (10 - filled),
        step,
        total,
        fmt_clock(t),
        left,
        rate,
    )


def emit_hf(trainer, t, ktok):
    """tqdm's way: redraw the bar after \r; a log line clears it, prints, and redraws it."""
    bar = hf_bar(trainer.step, t, ktok * 1000.0 / TOKENS_PER_STEP)
    if os.environ.get("DEMO_HF_BAR") == "0":
        bar = ""  # disable_tqdm=True: the Trainer's log dicts alone
    out = "\r" + bar
    if trainer.loss is not None and trainer.step > Output.logged:
        Output.logged = trainer.step
        nan = trainer.loss != trainer.loss
        logs = {
            "loss": trainer.loss if nan else round(trainer.loss, 4),
            "grad_norm": float("nan") if nan else 1.0 + trainer.rng.uniform(-0.3, 0.3),
            "learning_rate": 6e-4 * min(1.0, trainer.step / 200.0),
            # transformers rounds the logged epoch to 2 places; the demo's run is short, so
            # its epochs are counted over DEMO_STEPS (or 100 steps) to keep them moving.
            "epoch": round(trainer.step / float(env_int("DEMO_STEPS", 0) or 100), 2),
        }
        out = "\r%s\r%s\n%s" % (" " * len(Output.bar), logs, bar) if bar else "%s\n" % logs
    elif not bar:
        out = ""
    Output.bar = bar
    sys.stdout.write(out)
    sys.stdout.flush()


def emit_jsonl(trainer, t, ktok):
    q_pre, q_hs = trainer.queues(t)
    record = {
        "event": "train",
        "step": trainer.step,
        "loss": None if trainer.loss is None else round(trainer.loss, 4),
        "lr": 6e-4 * min(1.0, trainer.step / 200.0),
        "throughput": {"tokens_per_s": round(ktok * 1000.0, 1)},
        "queues": {"q_pre": q_pre, "q_hs": q_hs},
        "elapsed_s": round(t, 1),
    }
    print(json.dumps(record), flush=True)  # a nan loss prints as NaN


def emit_pipes(trainer, t, ktok):
    """`step 317 | loss 2.04 | tok/s 50676 | q_pre 13/16 | q_post 3/16`: what DFlash's reader
    cannot read, launcher status-format detect can."""
    q_pre, _ = trainer.queues(t)
    depth = round(QUEUE_DEPTH * sum(q_pre) / float(sum(QUEUE_TARGET)))
    loss = "---" if trainer.loss is None else "%.2f" % trainer.loss
    print(
        "step %d | loss %s | tok/s %d | q_pre %d/%d | q_post %d/%d"
        % (
            trainer.step,
            loss,
            round(ktok * 1000.0),
            depth,
            QUEUE_DEPTH,
            trainer.rng.randint(1, 4),
            QUEUE_DEPTH,
        ),
        flush=True,
    )


EMIT = {"dflash": emit_dflash, "hf": emit_hf, "jsonl": emit_jsonl, "pipes": emit_pipes}


# --- misbehaviours (see MISBEHAVIOURS) ------------------------------------------------------

FINALISER_NOISE = """\
Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f2c2c1f1ee0>
Traceback (most recent call last):
  File "/usr/lib/python3/dist-packages/torch/utils/data/dataloader.py", line 1478, in __del__
    self._shutdown_workers()
  File "/usr/lib/python3/dist-packages/torch/utils/data/dataloader.py", line 1461, in \
_shutdown_workers
    if w.is_alive():
  File "/usr/lib/python3.11/multiprocessing/process.py", line 160, in is_alive
    assert self._parent_pid == os.getpid(), 'can only test a child process'
AssertionError: can only test a child process"""


def misbehave(trainer, t, ktok):
    """Before a step: die (crashloop), sag, or print finaliser noise. The throughput to report."""
    mode = trainer.mode
    if mode == "crashloop" and t >= trainer.crash_after:
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer would
    if mode == "hang" and t >= env_float("DEMO_HANG_AFTER", 5):
        if Output.gpus is not None:
            Output.gpus.report(0)
        hang()
    if mode == "sag" and t >= env_float("DEMO_SAG_AFTER", 5):
        return ktok * 0.25
    if mode == "finalizer-noise" and t >= getattr(trainer, "noise_at", 2.0):
        print(FINALISER_NOISE, flush=True)
        trainer.noise_at = t + env_float("DEMO_NOISE_EVERY", 3)
    return ktok


def hang():
    """A hung collective: the process stays alive and prints nothing more (until C-c)."""
    sys.stdout.flush()
    while True:
        time.sleep(3600)


def diverge(trainer, t):
    """After a step: the loss of a diverged run, ~ln(vocabulary), from DEMO_DIVERGE_AFTER on."""
    late = t >= env_float("DEMO_DIVERGE_AFTER", 5)
    if trainer.mode == "diverge" and trainer.loss is not None and late:
        trainer.loss = DIVERGED_LOSS + trainer.rng.uniform(-0.03, 0.03)


def grad_norm_field(trainer, t):
    if trainer.mode != "nan-gradnorm":
        return ""
    if t >= trainer.nan_after:
        return " grad_norm=nan"
    return " grad_norm=%.3f" % (0.8 + trainer.rng.uniform(-0.1, 0.1))


def bursty(trainer, q_pre):
    if trainer.mode != "bursty":
        return q_pre
    trainer.lines_shown = getattr(trainer, "lines_shown", 0) + 1
    return q_pre[:-1] + ([max(1, q_pre[-1])] if trainer.lines_shown % 3 == 0 else [0])


def checkpoints_dir():
    return os.environ.get("LAUNCHER_CHECKPOINTS") or "checkpoints"


def resume(trainer):
    """Continue from the newest checkpoint, as a trainer restarted by a supervisor does."""
    if trainer.mode != "crashloop" and os.environ.get("DEMO_RESUME") != "1":
        return
    steps = []
    where = checkpoints_dir()
    for name in os.listdir(where) if os.path.isdir(where) else []:
        if name.startswith("step_") and name.endswith(".pt") and name[5:-3].isdigit():
            steps.append(int(name[5:-3]))
    if not steps:
        return
    step = max(steps)
    trainer.step = trainer.last_checkpoint = step
    trainer.tokens = step * TOKENS_PER_STEP
    print("Resuming from %s/step_%d.pt" % (os.path.basename(where), step), flush=True)


def main(argv):
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        return 0
    mode = os.environ.get("DEMO_MODE", "healthy")
    if mode not in MODES:
        sys.stderr.write("DEMO_MODE must be one of %s, not %r\n" % (", ".join(MODES), mode))
        return 2
    Output.format = os.environ.get("DEMO_FORMAT", "dflash")
    if Output.format not in FORMATS:
        sys.stderr.write("DEMO_FORMAT must be one of %s\n" % ", ".join(FORMATS))
        return 2
    interval = max(0.01, env_float("DEMO_INTERVAL", 1.0))
    gpus_env = os.environ.get("DEMO_GPUS")
    limit = int(gpus_env) if gpus_env else None
    if mode in ("cpu-fallback", "one-gpu"):
        limit = 0 if mode == "cpu-fallback" else min(1, 1 if limit is None else limit)
    Output.gpus = GpuUse(open_gpus(limit))  # the files are held for our lifetime
    if os.environ.get("DEMO_GPU_MONITOR") == "1":
        start_monitor()
    if os.environ.get("DEMO_SPAWN_CHILD") == "1":
        spawn_child()
    if os.environ.get("DEMO_IGNORE_SIGINT") == "1":
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    if mode == "silent":
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 130

    trainer = Trainer(mode, interval, env_float("DEMO_RAMP", 8))
    steps = env_int("DEMO_STEPS", 0)
    try:
        load = env_float("DEMO_LOAD_SECONDS", 0)
        if load > 0:
            print("Loading model...", flush=True)
            time.sleep(load)
            trainer.start = time.time()  # the ramp starts once the model is loaded
        print("Starting pipeline...", flush=True)
        print("Pipeline running. Monitoring...", flush=True)
        resume(trainer)
        next_at = time.time()
        while True:
            trainer.tick()
            if steps and trainer.step >= steps:
                sys.stdout.write("\nTraining completed. Do not forget to share your model!\n")
                sys.stdout.flush()
                return 0
            next_at += interval
            time.sleep(max(0.0, next_at - time.time()))
    except KeyboardInterrupt:
        print("Interrupted; saving checkpoint...", flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
