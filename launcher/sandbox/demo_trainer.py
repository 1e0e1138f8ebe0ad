#!/usr/bin/env python3
# mypy: allow-untyped-calls
"""Demo trainer for the launcher sandbox: prints DFlash-style status lines, holds GPUs.

Run inside a sandbox container, usually in tmux:  python3 train_demo.py

Environment:
  DEMO_MODE              healthy (default) | crash | stall | flat | nan | silent
  DEMO_INTERVAL          seconds between status lines (default 1.0)
  DEMO_RAMP              seconds for queues and throughput to reach the plateau (default 8)
  DEMO_CHECKPOINT_EVERY  write checkpoints/step_<N>.pt every N steps (default 5; 0 = never)
  DEMO_GPUS              how many fake GPU files to hold open (default: all of them)
  DEMO_CRASH_AFTER       crash: seconds before a RuntimeError traceback, exit 1 (default 5)
  DEMO_STALL_AFTER       stall: seconds before queues drain and steps stop (default 5)
  DEMO_NAN_AFTER         nan: seconds before the loss becomes nan (default 5)
  DEMO_SPAWN_CHILD=1     spawn a "dataloader worker" that ignores SIGHUP, SIGINT and SIGTERM
                         and holds a GPU file, so killing only the tmux session leaves it behind
  DEMO_IGNORE_SIGINT=1   ignore C-c (SIGINT)

modes:
  healthy  queues fill, throughput climbs to ~28 Ktok/s, loss falls, checkpoints appear
  crash    a real Python traceback after DEMO_CRASH_AFTER seconds, exit status 1
  stall    after DEMO_STALL_AFTER seconds: queues drain to 0, 0 Ktok/s, step stops; keeps printing
  flat     throughput stays around 0.5 Ktok/s
  nan      loss becomes nan after DEMO_NAN_AFTER seconds
  silent   prints nothing at all, just sleeps

On SIGINT it prints "Interrupted; saving checkpoint..." and exits 130.
"""

import math
import os
import random
import signal
import sys
import time

GPU_DIR = "/var/lib/sandbox-gpu"
MODES = ("healthy", "crash", "stall", "flat", "nan", "silent")
PLATEAU_KTOK = 28.0
FLAT_KTOK = 0.5
TOKENS_PER_STEP = 14000.0
TOTAL_STEPS = 2000000
QUEUE_TARGET = [8, 7, 6, 6, 5, 4]
HS_TARGET = 4


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


def open_gpus(limit=None):
    try:
        names = sorted(
            (n for n in os.listdir(GPU_DIR) if n.startswith("nvidia")), key=lambda n: int(n[6:])
        )
    except (OSError, ValueError):
        return []
    if limit is not None:
        names = names[:limit]
    return [open(os.path.join(GPU_DIR, n), "rb") for n in names]


def spawn_child():
    """Fork a worker that shrugs off SIGHUP, SIGINT and SIGTERM and holds a GPU file."""
    pid = os.fork()
    if pid:
        return pid
    for signum in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    held = open_gpus(1)  # noqa: F841 - kept open for the worker's lifetime
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
        os.makedirs("checkpoints", exist_ok=True)
        path = os.path.join("checkpoints", "step_%d.pt" % n)
        with open(path + ".tmp", "wb") as f:
            f.write(b"demo checkpoint step=%d\n" % n)
        os.replace(path + ".tmp", path)
        self.last_checkpoint = n

    def line(self, t, ktok):
        q_pre, q_hs = self.queues(t)
        if self.loss is None:
            stats = "loss=--- acc=--- streak=--- lr=---"
            eta = None
        else:
            acc = 0.0 if self.loss != self.loss else max(0.0, min(0.95, (6.5 - self.loss) / 5.0))
            streak = acc * 4.0
            lr = 6e-4 * min(1.0, self.step / 200.0) if self.step else 0.0
            loss = "nan" if self.loss != self.loss else "%.4f" % self.loss
            stats = "loss=%s acc=%.3f streak=%.1f lr=%.2e" % (loss, acc, streak, lr)
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
        ktok = self.throughput(t)
        self.advance(t, ktok)
        self.checkpoint()
        print(self.line(t, ktok), flush=True)

    def forward_backward(self):
        return self.all_reduce(self.step)

    def all_reduce(self, step):
        raise RuntimeError("NCCL error: unhandled cuda error at step %d (demo crash)" % step)


def main(argv):
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        return 0
    mode = os.environ.get("DEMO_MODE", "healthy")
    if mode not in MODES:
        sys.stderr.write("DEMO_MODE must be one of %s, not %r\n" % (", ".join(MODES), mode))
        return 2
    interval = max(0.01, env_float("DEMO_INTERVAL", 1.0))
    gpus_env = os.environ.get("DEMO_GPUS")
    held = open_gpus(int(gpus_env) if gpus_env else None)  # noqa: F841 - held for our lifetime
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
    try:
        print("Starting pipeline...", flush=True)
        print("Pipeline running. Monitoring...", flush=True)
        next_at = time.time()
        while True:
            trainer.tick()
            next_at += interval
            time.sleep(max(0.0, next_at - time.time()))
    except KeyboardInterrupt:
        print("Interrupted; saving checkpoint...", flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
