"""launcher against what its users would otherwise type, in one run on a sandbox of its own.

  A: the hand-written redeploy, one ssh per step (bench/handwritten.sh)
  B: the same steps over one multiplexed OpenSSH connection (handwritten.sh --control-dir)

Prints one table (figure, launcher, A, B, ratio, target, met). Exits 0 when targets are missed
(it reports); non-zero only when something could not be measured. Needs root (LXC, sshd).

Groups (--only): deploy status agent crash fleet startup parser scale imports watch project.
  project  redeploy of a 2,000-file, 50 MB project with one file changed, against rsync -az
  scale    status --all and deploy --restart --all + verify --all on 1, 16 and 64 containers
  imports  the import time of each command (python -X importtime)
  watch    the long watch figures: 10 min of resources, then 2x20 min of faults (about 50 min)
Without --only every group runs but watch; `--only watch` runs it. --quick runs every group,
watch included, at a size CI can afford (fleet of 2, scale 1/2/4, watch for seconds).

Usage: bench/run.py [--runs N] [--quick] [--json FILE] [--markdown] [--only GROUP,...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_project
import bench_watch
import figures
import imports
import scale
from harness import CRASH_VMID, DEPLOY_VMID, HAND_VMID, MUX_VMID, BenchEnv, BenchError, check
from rows import Row, render_markdown, render_text

LATENCIES = {0.0: 0.6, 0.3: 0.45}  # pct start-up latency -> target ratio launcher/B
FLEET = 16
# Figure groups, for --only. The default leaves out the full watch figures (about 50 minutes);
# --quick runs every group.
GROUPS = (
    "deploy", "status", "agent", "crash", "fleet", "startup", "parser", "scale", "imports", "watch",
    "project",
)  # fmt: skip
LONG = {"watch"}
# Groups that need a run on the "demo" target (DEPLOY_VMID) deployed before they start.
NEEDS_RUN = {"status", "agent", "imports"}
PROFILE = Path(__file__).resolve().parent / "profile_deploy.py"
PROFILE_STATUS = Path(__file__).resolve().parent / "profile_status.py"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def profile(env: BenchEnv, inventory: Path, latency: float) -> dict[str, Any]:
    """One in-process profiled deploy (a new script version, so the upload happens)."""
    env.set_latency(latency)
    try:
        env.new_script()
        result = env.run([str(env.python), str(PROFILE), "-i", str(inventory), "-t", "demo"])
        if result.code != 0:
            raise BenchError(f"profile_deploy.py exited {result.code}: {result.err[-2000:]}")
        data: dict[str, Any] = json.loads(result.out.strip().splitlines()[-1])
        data["wall"] = result.seconds
        return data
    finally:
        env.set_latency(0)


def profile_status(env: BenchEnv, inventory: Path, runs: int) -> dict[str, Any]:
    """One in-process profiled `launcher status`, and the parts of its round trip."""
    argv = [str(env.python), str(PROFILE_STATUS), "-i", str(inventory), "-t", "demo"]
    result = env.run([*argv, "--runs", str(runs)])
    if result.code != 0:
        raise BenchError(f"profile_status.py exited {result.code}: {result.err[-2000:]}")
    data: dict[str, Any] = json.loads(result.out.strip().splitlines()[-1])
    data["wall"] = result.seconds
    return data


def render_status_profile(profiles: dict[str, dict[str, Any]]) -> str:
    out = ["where one `launcher status` spends its time (one profiled run):"]
    for way, data in profiles.items():
        wall = data["wall"] - data["reference_seconds"]
        out.append(
            f"  {way}: {wall:.2f} s wall (interpreter start-up {wall - data['total']:.2f} s)"
        )
        out.extend(f"    {seconds:6.3f} s  {name}" for name, seconds in data["phases"])
        out.append("    its round trip in parts, on the same kind of connection (medians):")
        out.extend(f"      {seconds:6.3f} s  {name}" for name, seconds in data["references"])
    return "\n".join(out)


def render_profile(profiles: dict[float, dict[str, Any]]) -> str:
    out = ["where one deploy --restart spends its time (one profiled run):"]
    for latency, data in profiles.items():
        startup = data["wall"] - data["total"] - data["reference_seconds"]
        wall = data["wall"] - data["reference_seconds"]
        out.append(
            f"  pct latency {latency:g} s: {wall:.2f} s wall "
            f"(interpreter start-up and exit {startup:.2f} s; for reference, one bare agent "
            f"round trip on an open connection: {data['poll_round_trip']:.2f} s)"
        )
        out.extend(f"    {seconds:6.3f} s  {name}" for name, seconds in data["phases"])
    return "\n".join(out)


def measure(args: argparse.Namespace, env: BenchEnv, fleet: list[int]) -> list[Row]:
    """Every figure of the chosen groups that needs the sandbox, in the order of the table."""
    demo = env.playbook("demo")
    crash = env.playbook(
        "crash", session="crash", DEMO_MODE="crash", DEMO_CRASH_AFTER=f"{figures.CRASH_AFTER:g}"
    )
    # Freezes FREEZE_BEFORE s before the probe's warmup ends (the probe starts ~1 s after).
    freeze = env.playbook(
        "freeze",
        session="freeze",
        verify=figures.FREEZE_VERIFY,
        DEMO_MODE="hang",
        DEMO_INTERVAL="0.3",
        DEMO_HANG_AFTER=f"{figures.FREEZE_WAIT - figures.FREEZE_BEFORE:g}",
    )
    targets = {"demo": (DEPLOY_VMID, demo), "crash": (CRASH_VMID, crash)}
    inventory = env.inventory("inventory", {**targets, "freeze": (CRASH_VMID, freeze)})
    rows: list[Row] = []
    if "deploy" in args.only:
        results = {}
        for latency in LATENCIES:
            log(f"deploy --restart: launcher, A, B interleaved, pct latency {latency:g} s")
            results[latency] = figures.deploy_comparison(env, inventory, args.runs, latency, log)
        rows += figures.deploy_rows(results, LATENCIES)
        log("profiling one deploy per latency")
        args.profiles = {lat: profile(env, inventory, lat) for lat in LATENCIES}
    elif args.only & NEEDS_RUN:
        log("one deploy --restart, for a run to poll")
        check(env.launcher(inventory, "-t", "demo", "deploy", "--restart"), "deploy")
    if "status" in args.only:
        log("launcher status against one ssh capture-pane")
        rows += figures.status_rows(env, inventory, args.runs)
        log("profiling one status per connection kind")
        persisted = env.inventory(
            "inventory-persisted", {"demo": (DEPLOY_VMID, demo)}, control_persist=600
        )
        ways = {"a new SSH connection": inventory, "connection persisted": persisted}
        args.status_profiles = {
            way: profile_status(env, inv, 3 if args.quick else args.runs)
            for way, inv in ways.items()
        }
    if "agent" in args.only:
        log("bytes sent per verify poll, agent cached and not")
        rows += figures.agent_rows(env, inventory, 3 if args.quick else 10)
    if "imports" in args.only:
        log("import time per command (python -X importtime)")
        rows += imports.import_rows(env, inventory, "demo", args.runs, log)
    if "crash" in args.only:
        log("crash to verify exit")
        rows += figures.crash_rows(env, inventory, args.runs, log)
        log("freeze just before the warmup ends to verify exit")
        rows += figures.freeze_rows(env, inventory, args.runs, log)
    if "fleet" in args.only:
        log(f"fleet: {len(fleet)} containers against 1")
        rows += figures.fleet_rows(env, fleet, args.runs, log)
    if "scale" in args.only:
        sizes = scale.QUICK_SIZES if args.quick else scale.SIZES
        log(f"scale: status --all and deploy + verify --all on {', '.join(map(str, sizes))} CTs")
        rows += scale.scale_rows(env, scale.VMIDS, sizes, args.runs, log)
    if "project" in args.only:
        log("project: redeploy of 2,000 files / 50 MB with one changed, against rsync -az")
        rows += bench_project.project_rows(env, 2 if args.quick else args.runs, log)
    if "watch" in args.only:
        timing = bench_watch.QUICK if args.quick else (600.0, 1200.0, 120.0)
        rows += bench_watch.watch_rows(env, log, duration=timing[0], fault_duration=timing[1],
                                       period=timing[2])  # fmt: skip
    return rows


def groups(text: str) -> set[str]:
    chosen = {g.strip() for g in text.split(",") if g.strip()}
    unknown = chosen - set(GROUPS)
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"unknown group(s) {', '.join(sorted(unknown)) or '(none given)'}; "
            f"choose from {', '.join(GROUPS)}"
        )
    return chosen


def fleet_vmids(args: argparse.Namespace) -> list[int]:
    return list(range(300, 300 + (2 if args.quick else FLEET))) if "fleet" in args.only else []


def vmids(args: argparse.Namespace) -> list[int]:
    """The containers the chosen groups use (at least one: the sandbox needs one)."""
    chosen: set[int] = set()
    if args.only & ({"deploy"} | NEEDS_RUN):
        chosen.add(DEPLOY_VMID)
    if "deploy" in args.only:
        chosen |= {HAND_VMID, MUX_VMID}
    if "crash" in args.only:
        chosen.add(CRASH_VMID)
    if "project" in args.only:
        chosen |= {DEPLOY_VMID, HAND_VMID}
    chosen.update(fleet_vmids(args))
    if "scale" in args.only:
        chosen.update(scale.VMIDS[: max(scale.QUICK_SIZES if args.quick else scale.SIZES)])
    if "watch" in args.only:
        chosen.update(bench_watch.VMIDS)
    return sorted(chosen or {DEPLOY_VMID})


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5, help="runs per figure (median; default 5)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="1 run each, fleet of 2, scale 1/2/4, watch for seconds, targets not enforced (CI)",
    )
    parser.add_argument(
        "--stock-home",
        action="store_true",
        help=(
            "the sandbox host's SSH sessions get Debian's stock root dotfiles (as a Proxmox "
            "host's root), not this machine's ~/.bashrc"
        ),
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the rows as JSON")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument(
        "--only",
        type=groups,
        metavar="GROUP,...",
        help=(
            f"measure only these figure groups ({', '.join(GROUPS)}; default: all but "
            "watch, whose full figures take about 50 minutes (10 min resources, 2x20 min "
            "faults): `--only watch` runs them; --quick runs every group)"
        ),
    )
    args = parser.parse_args()
    if args.only is None:
        args.only = set(GROUPS) if args.quick else set(GROUPS) - LONG
    if args.quick:
        args.runs = 1
    if args.runs < 1:
        parser.error("--runs must be 1 or more")
    if os.geteuid() != 0:
        log("bench/run.py needs root (it brings up LXC containers and an sshd)")
        return 2
    enforce = not args.quick
    args.profiles = {}
    args.status_profiles = {}
    fleet = fleet_vmids(args)
    started = time.monotonic()

    env = BenchEnv(vmids(args), stock_home=args.stock_home)
    rows: list[Row] = []
    try:
        log(f"sandbox: {len(env.vmids)} containers under {env.tmp}")
        env.up()
        startup = []
        if "startup" in args.only:
            log("launcher --help / --version")
            startup = figures.startup_rows(env, 3 if args.quick else max(args.runs, 10))
        rows += measure(args, env, fleet)
        rows += startup
        if "parser" in args.only:
            log("parser")
            rows += figures.parser_rows(20_000 if args.quick else 200_000)
    except (BenchError, subprocess.SubprocessError, OSError, ValueError, KeyError) as error:
        if os.environ.get("BENCH_DEBUG"):
            traceback.print_exc()
        log(f"error: {error}")
        return 1
    finally:
        log("bringing the sandbox down")
        env.close()

    table = render_markdown(rows, enforce) if args.markdown else render_text(rows, enforce)
    print(table)
    if args.profiles:
        print()
        print(render_profile(args.profiles))
    if args.status_profiles:
        print()
        print(render_status_profile(args.status_profiles))
    if enforce:
        missed = [r.figure for r in rows if r.target and not r.met]
        print(f"\ntargets met: {sum(1 for r in rows if r.target) - len(missed)}", end="")
        print(f" of {sum(1 for r in rows if r.target)}" + (f"; missed: {missed}" if missed else ""))
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"({args.runs} run(s) per figure, {time.monotonic() - started:.0f} s; load {load})")
    if args.json:
        doc = {
            "runs": args.runs,
            "quick": args.quick,
            "rows": [r.to_json() for r in rows],
            "profile": {str(k): v for k, v in args.profiles.items()},
            "status_profile": args.status_profiles,
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
