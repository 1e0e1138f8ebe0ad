"""`launcher watch` benchmarks on the sandbox.

  resources   a watcher over 4 containers at a 2 s interval for DURATION: its RSS at the start
              and the end, and CPU time per poll (flat = no growth)
  faults      the demo trainer made to crash (and, separately, to hang with the pane alive)
              every PERIOD seconds for DURATION, watched with --restart-on-failure, resuming
              from its checkpoints: the share of wall time the run made progress, and where
              the rest went (detection, redeploy, trainer start, re-done steps)

Usage: bench/bench_watch.py [--quick] [--duration S] [--fault-duration S] [--period S]
(standalone: brings up a sandbox of its own; bench/run.py calls `watch_rows`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import BenchEnv, check
from rows import Row, render_text

WATCH_VMIDS = (310, 311, 312, 313)
FAULT_VMID = 314
# The demo trainer at its plateau with DEMO_INTERVAL 0.5: one step per status line.
SECONDS_PER_STEP = 0.5
CHECKPOINT_EVERY = 5
STALL_AFTER = 6.0  # a stall: the step unchanged this long (while the trainer may print)
# A hang: the step unchanged and nothing printed or checkpointed this long. The demo trainer
# prints a line every 0.5 s and writes its checkpoints at once: 2 s is four lines missed.
HANG_AFTER = 2.0
TICKS = os.sysconf("SC_CLK_TCK")


def _playbook(
    env: BenchEnv, name: str, vmid: int, stall_after: float, hang_after: float | None, **demo: str
) -> str:
    rel = env.playbook(name, session=name, **demo)
    path = env.project / rel
    book = yaml.safe_load(path.read_text())
    step = {"stall_after": stall_after, "hang_after": hang_after}
    book["verify"].update({"wait": 3, "interval": 1, "step": step})
    path.write_text(yaml.safe_dump(book, sort_keys=False))
    return rel


def _proc(pid: int) -> tuple[float, float]:
    """RSS (MiB) and CPU seconds (user + system) of a process."""
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return rss, (int(fields[11]) + int(fields[12])) / TICKS


class Watcher:
    """`launcher watch --json` in the background; events stamped with the time they arrived."""

    def __init__(self, env: BenchEnv, inventory: Path, *args: str) -> None:
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.proc = subprocess.Popen(
            env.launcher_argv(inventory, "watch", "--json", *args),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**env.env, "XDG_STATE_HOME": str(env.tmp / "state")},
            cwd=env.project,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.append((time.monotonic(), json.loads(line)))

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        self.reader.join(timeout=5)
        return code


def resources(env: BenchEnv, duration: float, log: Callable[[str], None]) -> list[Row]:
    targets = {f"w{v}": (v, _playbook(env, f"w{v}", v, 120, None)) for v in WATCH_VMIDS}
    inventory = env.inventory("watch-resources", targets)
    for name in targets:
        check(env.launcher(inventory, "-t", name, "deploy", "--restart"), f"deploy {name}")
    log(f"watch: 4 targets at 2 s for {duration:g} s")
    watcher = Watcher(env, inventory, "--all", "--interval", "2", "--for", f"{duration:g}")
    settle = min(10.0, duration / 4)
    time.sleep(settle)
    rss0, cpu0 = _proc(watcher.proc.pid)
    samples = [rss0]
    end = time.monotonic() + duration - settle - 2
    while time.monotonic() < end:
        time.sleep(min(5.0, max(0.1, end - time.monotonic())))
        rss, cpu1 = _proc(watcher.proc.pid)
        samples.append(rss)
    measured = duration - settle - 2
    polls = len(targets) * measured / 2
    watcher.wait(60)
    per_poll_ms = (cpu1 - cpu0) / polls * 1000
    quarters = [samples[min(len(samples) - 1, len(samples) * q // 4)] for q in range(5)]
    note = (
        f"{measured:.0f} s measured, RSS min/max {min(samples):.1f}/{max(samples):.1f} MiB; "
        f"at 0/25/50/75/100 %: {'/'.join(f'{r:.1f}' for r in quarters)} MiB"
    )
    # Flat means no growth once warm: the second half of the run (the first minutes fill
    # caches, sample windows and thread stacks once).
    late = samples[-1] - quarters[2]
    return [
        Row("watch RSS at start (4 targets, 2 s)", "MiB", round(rss0, 1), note=note),
        Row(
            "watch RSS growth over the run",
            "MiB",
            round(samples[-1] - rss0, 2),
            note="start to end, warm-up included",
        ),
        Row(
            "watch RSS growth over the run's second half",
            "MiB",
            round(late, 2),
            target="< 1 MiB",
            met=late < 1,
        ),
        Row("watch CPU per poll", "ms", round(per_poll_ms, 2), note=f"{polls:.0f} polls"),
    ]


def faults(
    env: BenchEnv, mode: str, period: float, duration: float, log: Callable[[str], None]
) -> Row:
    """One trainer that crashes (or hangs) `period` s after each start, restarted each time."""
    name = f"f{mode}"
    after = {"crash": "DEMO_CRASH_AFTER", "hang": "DEMO_HANG_AFTER"}[mode]
    book = _playbook(
        env, name, FAULT_VMID, STALL_AFTER, HANG_AFTER, DEMO_MODE=mode, DEMO_RESUME="1",
        DEMO_CHECKPOINT_EVERY=str(CHECKPOINT_EVERY), **{after: f"{period:g}"},
    )  # fmt: skip
    inventory = env.inventory(f"watch-{mode}", {name: (FAULT_VMID, book)})
    env.sandbox.ct_exec(FAULT_VMID, ["rm", "-rf", f"/root/{name}/checkpoints"])
    check(env.launcher(inventory, "-t", name, "deploy", "--restart"), f"deploy {name}")
    started = time.monotonic()
    log(f"watch: {mode} every {period:g} s for {duration:g} s, --restart-on-failure")
    watcher = Watcher(
        env, inventory, "-t", name, "--restart-on-failure", "--max-restarts", "1000",
        "--restart-backoff", "0", "--for", f"{duration:g}",
    )  # fmt: skip
    watcher.wait(duration + 120)
    wall = time.monotonic() - started
    pane = env.sandbox.ct_exec(
        FAULT_VMID, ["tmux", "capture-pane", "-p", "-S", "-50", "-t", f"={name}:"]
    ).stdout.decode()
    final = max((int(w[5:]) for w in pane.split() if w.startswith("step=") and w[5:].isdigit()),
                default=0)  # fmt: skip
    # The next fault run shares the container (and its GPUs): this run ends here.
    check(env.launcher(inventory, "-t", name, "stop"), f"stop {name}")
    return _fault_row(mode, period, wall, started, final, watcher.events)


def _fault_row(
    mode: str,
    period: float,
    wall: float,
    started: float,
    final_step: int,
    events: list[tuple[float, dict[str, Any]]],
) -> Row:
    progress = final_step * SECONDS_PER_STEP
    launch = started
    detection = redeploy = redone = 0.0
    unhealthy_at: float | None = None
    restarts = 0
    for at, event in events:
        if event["kind"] == "unhealthy":
            unhealthy_at = at
            detection += max(0.0, at - (launch + period))
            step = event.get("step") or 0
            redone += (step % CHECKPOINT_EVERY) * SECONDS_PER_STEP
        elif event["kind"] == "restart" and unhealthy_at is not None:
            redeploy += at - unhealthy_at
            launch, restarts = at, restarts + 1
    start = max(0.0, wall - progress - detection - redeploy - redone)
    share = progress / wall if wall else 0.0
    note = (
        f"{restarts} restarts in {wall:.0f} s; lost: detection {detection:.0f} s, "
        f"redeploy {redeploy:.0f} s, trainer start and the rest {start:.0f} s, "
        f"re-done steps {redone:.0f} s"
    )
    return Row(
        f"effective training time, {mode} every {period:g} s",
        "%",
        round(share * 100, 1),
        target=">= 95 %",
        met=share >= 0.95,
        note=note,
    )


def watch_rows(
    env: BenchEnv,
    log: Callable[[str], None],
    *,
    duration: float,
    fault_duration: float,
    period: float,
) -> list[Row]:
    rows = resources(env, duration, log)
    for mode in ("crash", "hang"):
        rows.append(faults(env, mode, period, fault_duration, log))
    return rows


VMIDS = (*WATCH_VMIDS, FAULT_VMID)
# --quick: resources run, each fault run, fault period (seconds): under a minute in all.
QUICK = (12.0, 15.0, 8.0)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="short runs (CI): about a minute")
    parser.add_argument("--duration", type=float, default=600, help="resources run, seconds")
    parser.add_argument("--fault-duration", type=float, default=1200, help="each fault run")
    parser.add_argument("--period", type=float, default=120, help="a fault every PERIOD s")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.fault_duration, args.period = QUICK
    env = BenchEnv(VMIDS)
    try:
        env.up()
        rows = watch_rows(
            env,
            lambda m: print(m, file=sys.stderr, flush=True),
            duration=args.duration,
            fault_duration=args.fault_duration,
            period=args.period,
        )
    finally:
        env.close()
    print(render_text(rows, not args.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
