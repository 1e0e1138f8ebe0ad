"""Each benchmark figure: run launcher and its alternatives on the sandbox, return table rows."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import (
    CRASH_VMID,
    DEPLOY_VMID,
    HAND_VMID,
    MUX_VMID,
    SESSION,
    WORKDIR,
    BenchEnv,
    BenchError,
    Timed,
    check,
)
from rows import Row, median

Log = Callable[[str], None]
AGENT_BYTES = Path(__file__).resolve().parent / "agent_bytes.py"
MAX_RSS = re.compile(r"Maximum resident set size \(kbytes\): (\d+)")
CRASH_AFTER = 3.0
CRASH_INTERVAL = 2.0
HAND_CHECK = 180.0  # the hand-run check: look at the pane after the warmup
# A run that prints every 0.3 s and freezes FREEZE_BEFORE s before the probe's warmup ends (a
# rank hung in a collective): verify --wait FREEZE_WAIT --interval CRASH_INTERVAL.
FREEZE_WAIT = 12.0
FREEZE_BEFORE = 4.0
FREEZE_STALL = 20.0
FREEZE_VERIFY = {"step": {"stall_after": FREEZE_STALL}, "successes": 3, "window": 60}


@dataclass
class Samples:
    """Per-run measurements of one contender in an interleaved comparison."""

    seconds: list[float] = field(default_factory=list)
    pct: list[int] = field(default_factory=list)
    ssh: list[int] = field(default_factory=list)

    def add(self, env: BenchEnv, run: Callable[[], Timed], what: str) -> None:
        pct0, ssh0 = env.pct_calls(), env.ssh_accepts()
        result = check(run(), what)
        self.seconds.append(result.seconds)
        self.pct.append(env.pct_calls() - pct0)
        self.ssh.append(env.ssh_accepts() - ssh0)


def printed_json(result: Timed, what: str) -> dict[str, Any]:
    """The JSON document a command printed (the last one, if it printed several)."""
    try:
        doc = json.loads(result.out)
    except ValueError:
        tail = "\n".join((result.err or result.out).strip().splitlines()[-8:])
        raise BenchError(f"{what} printed no JSON (exit {result.code}):\n{tail}") from None
    if isinstance(doc, list):
        doc = doc[-1]
    if not isinstance(doc, dict):
        raise BenchError(f"{what} printed unexpected JSON: {result.out[:200]}")
    return doc


def _counts(values: list[int]) -> float | str:
    lo, hi = min(values), max(values)
    return float(lo) if lo == hi else f"{lo}–{hi}"


# -- the connection persisted ----------------------------------------------------------------


# What a terminal's user gets by default (console.py sets LAUNCHER_CONTROL_PERSIST=60 there): the
# host's connection kept by a background process between commands, each command a process of
# its own. The benchmark has no terminal: its inventory sets control_persist, as a user may.
def persisted_inventory(env: BenchEnv) -> Path:
    return env.inventory(
        "inventory-persisted", {"demo": (DEPLOY_VMID, env.playbook("demo"))}, control_persist=600
    )


# -- deploy --restart against A and B ---------------------------------------------------------


def deploy_comparison(
    env: BenchEnv, inventory: Path, runs: int, latency: float, log: Log
) -> tuple[Samples, Samples, Samples, Samples]:
    """Interleaved L, A, B runs of the same redeploy (a new script version each round), and L
    with its connection persisted (P)."""
    env.set_latency(latency)
    launcher, hand, mux, persisted = Samples(), Samples(), Samples(), Samples()
    deploy = ("-t", "demo", "deploy", "--restart")
    kept = persisted_inventory(env)

    def run_b() -> Timed:
        result = env.run(env.handwritten_argv(MUX_VMID, mux=True))
        env.close_master()  # after the timed part
        return result

    try:
        # Warm-up (not counted): the workdirs (a redeploy by hand assumes one), caches, the
        # persisted connection's background process.
        for vmid in (HAND_VMID, MUX_VMID):
            env.sandbox.ct_exec(vmid, ["mkdir", "-p", WORKDIR])
        check(env.launcher(inventory, *deploy), "warm-up deploy")
        check(env.launcher(kept, *deploy), "warm-up deploy, connection persisted")
        check(env.run(env.handwritten_argv(HAND_VMID, mux=False)), "warm-up A")
        check(run_b(), "warm-up B")
        for i in range(runs):
            env.new_script()
            launcher.add(env, lambda: env.launcher(inventory, *deploy), "launcher deploy")
            env.new_script()
            persisted.add(
                env, lambda: env.launcher(kept, *deploy), "launcher deploy, connection persisted"
            )
            hand.add(env, lambda: env.run(env.handwritten_argv(HAND_VMID, mux=False)), "A")
            mux.add(env, run_b, "B")
            log(
                f"  run {i + 1}/{runs} at {latency:g} s pct latency: launcher "
                f"{launcher.seconds[-1]:.2f} s, persisted {persisted.seconds[-1]:.2f} s, "
                f"A {hand.seconds[-1]:.2f} s, B {mux.seconds[-1]:.2f} s"
            )
    finally:
        env.set_latency(0)
    return launcher, hand, mux, persisted


def deploy_rows(
    results: dict[float, tuple[Samples, Samples, Samples, Samples]], targets: dict[float, float]
) -> list[Row]:
    rows = []
    for persisted in (False, True):
        for latency, (lau, hand, mux, kept) in results.items():
            mine = kept if persisted else lau
            lm, am, bm = median(mine.seconds), median(hand.seconds), median(mux.seconds)
            goal = targets.get(latency)
            label = f"deploy --restart wall, pct latency {latency:g} s"
            note = f"median of {len(mine.seconds)}; ratio launcher/B"
            if persisted:
                label += ", connection persisted"
                note += (
                    "; each command a process of its own, the host's connection kept by a "
                    "background process (control_persist; a terminal's default, 60 s); "
                    f"{_counts(kept.ssh)} SSH connections, {_counts(kept.pct)} pct calls per deploy"
                )
            rows.append(
                Row(
                    label,
                    "s",
                    lm,
                    am,
                    bm,
                    ratio=lm / bm,
                    target=f"<= {goal:g}x B" if goal else "",
                    met=lm / bm <= goal if goal else None,
                    note=note,
                )
            )
    lau, hand, mux, _ = results[min(results)]
    pct = max(lau.pct)
    rows.append(
        Row(
            "pct invocations per deploy --restart",
            "calls",
            _counts(lau.pct),
            _counts(hand.pct),
            _counts(mux.pct),
            target="<= 3",
            met=pct <= 3,
        )
    )
    rows.append(
        Row(
            "SSH connections per deploy --restart",
            "conns",
            _counts(lau.ssh),
            _counts(hand.ssh),
            _counts(mux.ssh),
            target="1 per host",
            met=max(lau.ssh) <= 1,
            note="sshd 'Accepted publickey' lines",
        )
    )
    return rows


# -- crash to verify exit, one poll -----------------------------------------------------------


def crash_rows(env: BenchEnv, inventory: Path, runs: int, log: Log) -> list[Row]:
    """Deploy a trainer that crashes after 3 s; time from its exit to verify exiting 1."""
    delays: list[float] = []
    per_poll: list[float] = []
    conns: list[int] = []
    exit_file = "/root/crash/.launcher/crash.exit"
    for i in range(runs):
        check(env.launcher(inventory, "-t", "crash", "deploy", "--restart"), "crash deploy")
        pct0, ssh0 = env.pct_calls(), env.ssh_accepts()
        started = time.time()
        result = check(
            env.launcher(
                inventory,
                "-t",
                "crash",
                "verify",
                "--wait",
                "60",
                "--interval",
                f"{CRASH_INTERVAL:g}",
                "--json",
                timeout=90,
            ),
            "verify of a crashing run",
            codes=(1,),
        )
        report = printed_json(result, "verify --json")
        if report.get("verdict") != "unhealthy":
            raise BenchError(f"verify of a crashing run said {report.get('verdict')!r}")
        crashed = env.ct_file_mtime(CRASH_VMID, exit_file)
        if crashed is None or crashed < started - 2:
            raise BenchError(f"the crashing trainer left no fresh {exit_file}")
        polls = int(report["timings"]["polls"])
        delays.append(result.ended - crashed)
        per_poll.append((env.pct_calls() - pct0) / max(polls, 1))
        conns.append(env.ssh_accepts() - ssh0)
        log(f"  run {i + 1}/{runs}: verify exited {delays[-1]:.2f} s after the crash")
    limit = CRASH_INTERVAL + 2
    return [
        Row(
            f"crash to verify exit 1 (--interval {CRASH_INTERVAL:g})",
            "s",
            median(delays),
            HAND_CHECK,
            HAND_CHECK,
            target=f"<= {limit:g} s",
            met=median(delays) <= limit,
            note=f"median of {runs}; A/B: the hand-run check after the warmup",
        ),
        Row(
            "pct invocations per verify poll",
            "calls",
            max(per_poll),
            target="1",
            met=max(per_poll) <= 1,
        ),
        Row(
            "SSH connections per verify",
            "conns",
            _counts(conns),
            target="1 per host",
            met=max(conns) <= 1,
        ),
    ]


def freeze_rows(env: BenchEnv, inventory: Path, runs: int, log: Log) -> list[Row]:
    """A trainer that freezes just before the warmup ends: verify must exit 1 (never 0), at
    stall_after after the freeze. The freeze is the last write of the run's log."""
    delays: list[float] = []
    codes: list[int] = []
    log_file = "/root/freeze/.launcher/freeze.log"
    for i in range(runs):
        check(env.launcher(inventory, "-t", "freeze", "deploy", "--restart"), "freeze deploy")
        result = env.launcher(
            inventory, "-t", "freeze", "verify", "--wait", f"{FREEZE_WAIT:g}",
            "--interval", f"{CRASH_INTERVAL:g}", "--json", timeout=120,
        )  # fmt: skip
        report = printed_json(result, "verify --json")
        codes.append(result.code)
        frozen = env.ct_file_mtime(CRASH_VMID, log_file)
        if frozen is None:
            raise BenchError(f"the freezing trainer left no {log_file}")
        delays.append(result.ended - frozen)
        log(
            f"  run {i + 1}/{runs}: verify exited {result.code} ({report.get('state')}) "
            f"{delays[-1]:.2f} s after the freeze"
        )
    check(env.launcher(inventory, "-t", "freeze", "stop"), "freeze stop")
    limit = FREEZE_STALL + CRASH_INTERVAL + 2
    never_healthy = all(code == 1 for code in codes)
    return [
        Row(
            f"freeze {FREEZE_BEFORE:g} s before the warmup ends to verify exit 1 "
            f"(--wait {FREEZE_WAIT:g} --interval {CRASH_INTERVAL:g}, stall_after "
            f"{FREEZE_STALL:g})",
            "s",
            median(delays),
            target=f"exit 1 every run, <= {limit:g} s",
            met=never_healthy and median(delays) <= limit,
            note=f"median of {runs}; exit codes {sorted(set(codes))}; status lines every 0.3 s "
            "until the freeze; before the cadence rule: HEALTHY (exit 0) 8 s into the freeze "
            "(the same probe on a recorded pane)",
        )
    ]


# launcher status against A (one ssh capture-pane): with a new SSH connection of its own (a
# script's or CI's way: no terminal, nothing persisted), and through a persisted connection (a
# terminal's default; like B, it makes no handshake). Issue 44's targets.
STATUS_TARGETS = {"direct": 1.5, "persisted": 0.6}


def status_rows(env: BenchEnv, inventory: Path, runs: int) -> list[Row]:
    """`launcher status` (start-up + one poll, judged) next to one hand-typed capture-pane over
    ssh: A a new ssh connection each time, B over a warm OpenSSH ControlMaster. launcher by
    itself, and with its connection persisted (control_persist), interleaved."""
    capture = ["pct", "exec", str(DEPLOY_VMID), "--", "tmux", "capture-pane", "-p", "-J"]
    capture += ["-S", "-500", "-t", SESSION]
    kept = persisted_inventory(env)
    master = ("-o", "ControlMaster=auto", "-o", "ControlPersist=600")
    check(env.run(env.ssh_argv("true", mux=True, options=master)), "ssh ControlMaster")
    # The persisted connection's background process, and the agent cache.
    for _ in range(2):
        check(env.launcher(kept, "-t", "demo", "status"), "status", codes=(0, 1))
    times: dict[str, list[float]] = {"direct": [], "persisted": [], "A": [], "B": []}
    pct: dict[str, list[int]] = {"direct": [], "persisted": []}
    accepts0 = env.ssh_accepts()
    for _ in range(runs):
        for way, inv in (("direct", inventory), ("persisted", kept)):
            pct0 = env.pct_calls()
            result = check(env.launcher(inv, "-t", "demo", "status"), "status", codes=(0, 1))
            times[way].append(result.seconds)
            pct[way].append(env.pct_calls() - pct0)
        times["A"].append(check(env.run(env.ssh_argv(*capture)), "ssh capture-pane").seconds)
        mux = env.ssh_argv(*capture, mux=True)
        times["B"].append(check(env.run(mux), "ssh capture-pane over the master").seconds)
    # Each run: launcher by itself and A connect once each; persisted launcher and B never.
    new_connections = env.ssh_accepts() - accepts0 - 2 * runs
    a, b = median(times["A"]), median(times["B"])
    rows = []
    for way, label, goal, note in (
        (
            "direct",
            "launcher status (one poll, judged) wall",
            STATUS_TARGETS["direct"],
            "a new SSH connection each (a script's or CI's way)",
        ),
        (
            "persisted",
            "launcher status, connection persisted (control_persist)",
            STATUS_TARGETS["persisted"],
            f"a terminal's default (60 s there); no SSH connection ({new_connections} opened "
            f"in {runs} runs): the poll through the persisted connection's background process",
        ),
    ):
        mine = median(times[way])
        rows.append(
            Row(
                label,
                "s",
                mine,
                a,
                b,
                ratio=mine / a,
                target=f"<= {goal:g}x A",
                met=mine / a <= goal,
                note=f"{max(pct[way])} pct call; {note}; A: one ssh pct exec tmux capture-pane, "
                f"B: the same over a warm ControlMaster (B/A {b / a:.2f}x); ratio launcher/A; "
                f"median of {runs}",
            )
        )
    return rows


# -- what a verify poll sends ----------------------------------------------------------------


def agent_rows(env: BenchEnv, inventory: Path, polls: int) -> list[Row]:
    """Bytes per verify poll once the agent is cached in the container (after the first poll,
    which sends it), and one poll's round trip cached next to sending the source each time."""
    cleared = env.clear_agent_cache(DEPLOY_VMID)
    result = check(
        env.run([env.python, AGENT_BYTES, "-i", inventory, "-t", "demo", "--polls", str(polls)]),
        "bench/agent_bytes.py",
    )
    data = json.loads(result.out.strip().splitlines()[-1])
    first, after = data["first"], data["after"]
    cached, source = median(data["cached"]), median(data["source"])
    return [
        Row(
            "bytes sent per verify poll after the first",
            "bytes",
            float(max(after)),
            target="<= 2048 B",
            met=max(after) <= 2048,
            note=(
                f"command line + stdin of its pct exec, largest of {len(after)}; the first poll "
                f"(cache cleared{'' if cleared else ', none there'}) sent {sum(first):,} B "
                f"in {len(first)} round trips"
            ),
        ),
        Row(
            "one verify poll round trip (open connection)",
            "s",
            cached,
            ratio=cached / source,
            note=(
                f"median of {polls}; sending the agent's source with every call instead: "
                f"{source:.3f} s; ratio cached/source"
            ),
        ),
    ]


# -- start-up ---------------------------------------------------------------------------------


def startup_rows(env: BenchEnv, runs: int) -> list[Row]:
    script = env.python.parent / "launcher"
    ways: list[tuple[str, list[str]]] = [
        ("python -m launcher", [str(env.python), "-m", "launcher"])
    ]
    if script.is_file():
        ways.insert(0, (".venv/bin/launcher", [str(script)]))
    rows = []
    for flag in ("--help", "--version"):
        for label, argv in ways:
            check(env.run([*argv, flag]), f"{label} {flag}")  # warm-up
            times = [check(env.run([*argv, flag]), f"{label} {flag}").seconds for _ in range(runs)]
            rows.append(
                Row(
                    f"launcher {flag} wall ({label})",
                    "s",
                    median(times),
                    target="<= 0.25 s",
                    met=median(times) <= 0.25,
                    note=f"median of {runs}",
                )
            )
    return rows


# -- fleet ------------------------------------------------------------------------------------


def supports_all(env: BenchEnv, inventory: Path) -> tuple[bool, bool]:
    """(deploy and verify take --all, deploy takes --parallel)."""
    deploy = env.launcher(inventory, "deploy", "--help").out
    verify = env.launcher(inventory, "verify", "--help").out
    return "--all" in deploy and "--all" in verify, "--parallel" in deploy


def _max_rss_mib(err: str) -> float:
    found = MAX_RSS.findall(err)
    return max(int(k) for k in found) / 1024 if found else float("nan")


def _parallel(env: BenchEnv, argvs: list[list[str]], timeout: float) -> tuple[float, list[Timed]]:
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            a,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env.env,
            cwd=env.project,
        )
        for a in argvs
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        results.append(Timed(0.0, p.returncode, out, err, time.time()))
    return time.perf_counter() - start, results


@dataclass
class FleetRun:
    deploy: float
    verify: float
    rss_mib: float
    deploy_ssh: int
    verify_codes: list[int]
    busy: float = 0.0  # fraction of the machine's CPU in use while it ran
    cpu: float = 0.0  # CPU seconds of the launcher processes themselves (user + system)

    @property
    def seconds(self) -> float:
        return self.deploy + self.verify


def fleet_once(
    env: BenchEnv, inventory: Path, targets: list[str], multi: tuple[bool, bool]
) -> FleetRun:
    """deploy --restart then verify on every target of `inventory`; wall time of both."""
    busy0, cpu0 = env.cpu_ticks(), env.children_cpu()
    run = _fleet_once(env, inventory, targets, multi)
    busy1 = env.cpu_ticks()
    run.busy = (busy1[0] - busy0[0]) / max(busy1[1] - busy0[1], 1)
    run.cpu = env.children_cpu() - cpu0
    return run


def _fleet_once(
    env: BenchEnv, inventory: Path, targets: list[str], multi: tuple[bool, bool]
) -> FleetRun:
    all_ok, parallel = multi
    verify = ["verify", "--wait", "5", "--interval", "1", "--successes", "2", "--window", "30"]
    timev = ["/usr/bin/time", "-v"]
    limit = max(180.0, 5.0 * len(targets))  # a kill cap only; 64 targets on 2 cores need more
    ssh0 = env.ssh_accepts()
    if all_ok:
        par = ["--parallel", str(len(targets))] if parallel else []
        deploy = check(
            env.launcher(inventory, "deploy", "--restart", "--all", *par, timeout=limit),
            "deploy --all",
        )
        ssh = env.ssh_accepts() - ssh0
        ver = env.run(
            [*timev, *env.launcher_argv(inventory, *verify, "--all", *par)], timeout=limit
        )
        return FleetRun(deploy.seconds, ver.seconds, _max_rss_mib(ver.err), ssh, [ver.code])
    d_wall, deploys = _parallel(
        env, [env.launcher_argv(inventory, "-t", t, "deploy", "--restart") for t in targets], limit
    )
    for d in deploys:
        check(d, "deploy (one process per target)")
    ssh = env.ssh_accepts() - ssh0
    v_wall, vers = _parallel(
        env, [[*timev, *env.launcher_argv(inventory, "-t", t, *verify)] for t in targets], limit
    )
    rss = max(_max_rss_mib(v.err) for v in vers)
    return FleetRun(d_wall, v_wall, rss, ssh, [v.code for v in vers])


def stop_all(env: BenchEnv, inventory: Path, log: Log) -> None:
    """Stop every run of `inventory`, so its trainers load no later figure."""
    log("  stopping the trainers (so they load no later figure)")
    stopped = env.launcher(inventory, "stop", "--all", "--grace", "2", timeout=300)
    if stopped.code != 0:
        log(f"  stop --all exited {stopped.code}; some trainers may still run")


def fleet_rows(env: BenchEnv, vmids: list[int], runs: int, log: Log) -> list[Row]:
    book = env.playbook("fleet")
    names = [f"fleet-{v}" for v in vmids]
    inv_n = env.inventory("fleet-n", {n: (v, book) for n, v in zip(names, vmids, strict=True)})
    inv_1 = env.inventory("fleet-1", {names[0]: (vmids[0], book)})
    multi = supports_all(env, inv_n)
    fallback = "" if multi[0] else f"FALLBACK: {len(vmids)} separate launcher processes"
    one: list[FleetRun] = []
    many: list[FleetRun] = []
    fleet_once(env, inv_n, names, multi)  # warm-up: first launch everywhere
    for i in range(runs):
        env.new_script()
        one.append(fleet_once(env, inv_1, names[:1], multi))
        many.append(fleet_once(env, inv_n, names, multi))
        log(
            f"  run {i + 1}/{runs}: 1 CT {one[-1].deploy:.2f} + {one[-1].verify:.2f} s, "
            f"{len(vmids)} CTs {many[-1].deploy:.2f} + {many[-1].verify:.2f} s (deploy + verify)"
        )
    t1 = median([r.seconds for r in one])
    tn = median([r.seconds for r in many])
    unhealthy = sum(1 for r in one + many for c in r.verify_codes if c != 0)
    notes = [
        n for n in (fallback, f"{unhealthy} verify runs not healthy" if unhealthy else "") if n
    ]
    split = (
        f"deploy + verify medians: 1 CT {median([r.deploy for r in one]):.2f} + "
        f"{median([r.verify for r in one]):.2f} s, {len(vmids)} CTs "
        f"{median([r.deploy for r in many]):.2f} + {median([r.verify for r in many]):.2f} s"
    )
    busy = (
        f"machine CPU busy (all {os.cpu_count()} cores): 1 CT "
        f"{median([r.busy for r in one]):.0%}, {len(vmids)} CTs "
        f"{median([r.busy for r in many]):.0%}"
    )
    note = "; ".join([split, busy, *notes])
    rss = median([r.rss_mib for r in many])
    n = len(vmids)
    if multi[0]:
        stop_all(env, inv_n, log)
    return [
        Row(
            f"fleet: deploy --restart + verify, {n} CTs vs 1",
            "s",
            tn,
            ratio=tn / t1,
            target="<= 2x one",
            met=tn / t1 <= 2,
            note=note,
        ),
        Row(
            f"SSH connections per deploy on {n} CTs (one host)",
            "conns",
            _counts([r.deploy_ssh for r in many]),
            target="1 per host",
            met=max(r.deploy_ssh for r in many) <= 1,
            note=fallback,
        ),
        Row(
            f"peak RSS of verify on {n} CTs",
            "MiB",
            rss,
            target="<= 150 MiB",
            met=rss <= 150,
            note="/usr/bin/time -v" + (", largest process (fallback)" if fallback else ""),
        ),
    ]


# -- parser -----------------------------------------------------------------------------------


def parser_rows(lines: int) -> list[Row]:
    """Lines per second, best of 3: parsing alone, and parsing plus reading what checks read.

    Field values are converted when first read, so the second figure is the one that counts.
    """
    from bench_parser import measure, synthetic_pane

    rows = []
    for label, count, best in measure(synthetic_pane(lines)):
        rate = count / best
        rows.append(
            Row(
                f"parser: status lines/s, {label}",
                "lines/s",
                rate,
                target=">= 100,000/s",
                met=rate >= 100_000,
                note=f"{count:,} lines, best of 3, one core",
            )
        )
    return rows
