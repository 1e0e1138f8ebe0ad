"""`launcher history`: the container's deploy records, newest first, and `--diff A B` (what
changed from one run to another); their lines for people."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from launcher.agent import protocol as p
from launcher.config.models import Target
from launcher.container.agentclient import AgentClient, container_for
from launcher.container.pct import HostConnection
from launcher.core.errors import ExitCode, UsageError
from launcher.core.requests import HistoryRequest
from launcher.deploy.provenance import describe as describe_source
from launcher.deploy.provenance import describe_overrides
from launcher.output.termsafe import sanitize
from launcher.targets.fleet import Outcome
from launcher.targets.workflow import Context


@dataclass
class HistoryResult:
    exit_code: ExitCode
    summary: str
    path: str
    records: list[dict[str, Any]] = field(default_factory=list)  # newest first
    target: str = ""
    diff: dict[str, Any] | None = None  # with --diff A B: what changed (run_diff)

    def to_json(self) -> dict[str, Any]:
        """The target's item of `history --json` (schema launcher.history/1)."""
        document = {
            "target": self.target,
            "exit_code": int(self.exit_code),
            "path": self.path,
            "records": self.records,
        }
        if self.diff is not None:
            document["diff"] = self.diff
        return document


def run_history(ctx: Context, request: HistoryRequest) -> HistoryResult:
    """`launcher history` on the context's target."""
    if request.diff:
        result = history_diff(ctx.target, ctx.conn, request.diff)
    else:
        result = history(ctx.target, ctx.conn, limit=request.limit)
    result.target = ctx.target.name
    return result


def history_row(ctx: Context, result: HistoryResult) -> Outcome:
    return Outcome(
        ctx.target.name, result.exit_code, result.summary, result.to_json(), value=result
    )


def history(target: Target, conn: HostConnection, *, limit: int = 0) -> HistoryResult:
    """The container's deploy records (<workdir>/.launcher/deploys.jsonl), newest first."""
    spec = target.playbook.spec
    request: p.HistoryRequest = {"op": "history", "workdir": spec.workdir, "limit": limit}
    answer = AgentClient(container_for(target, conn)).history(
        request, timeout=conn.endpoint.command_timeout
    )
    records = [r for r in answer["records"] if isinstance(r, dict)]
    total = answer["total"]
    path = answer["path"]
    if not records:
        return HistoryResult(ExitCode.OK, f"no deploys recorded on {target.label}", path)
    latest = records[0]
    summary = (
        f"{total} deploy(s) on {target.label}; latest {latest.get('time')} "
        f"sha256 {str(latest.get('sha256') or '')[:12]} ({latest.get('outcome')})"
    )
    return HistoryResult(ExitCode.OK, sanitize(summary, keep_sgr=False), path, records)


def history_diff(target: Target, conn: HostConnection, runs: tuple[str, ...]) -> HistoryResult:
    """`history --diff A B`: the two runs' records and what changed from A to B; the env is
    compared in the container (names only: values may be secrets)."""
    if len(runs) != 2:
        raise UsageError(f"--diff takes two runs, not {len(runs)}")
    every = history(target, conn)
    first, second = (find_run(every.records, run) for run in runs)
    request: p.HistoryRequest = {
        "op": "history",
        "workdir": target.playbook.spec.workdir,
        "limit": 1,
        "diff": [str(first["run"]), str(second["run"])],
    }
    answer = AgentClient(container_for(target, conn)).history(
        request, timeout=conn.endpoint.command_timeout
    )
    diff = run_diff(first, second, answer.get("env_diff"))
    summary = f"{target.label}: {first['run']} -> {second['run']}: {len(diff['changes'])} change(s)"
    return HistoryResult(ExitCode.OK, sanitize(summary, keep_sgr=False), every.path,
                         [second, first], diff=diff)  # fmt: skip


def find_run(records: list[dict[str, Any]], wanted: str) -> dict[str, Any]:
    """The launched record of a run named by its marker, its id, or the start of its id."""
    launched = [
        r for r in records if isinstance(r.get("run"), str) and r.get("outcome") == "launched"
    ]
    found = [
        r for r in launched
        if r["run"] == wanted or r["run"].partition(":")[2].startswith(wanted)
    ]  # fmt: skip
    if not found:
        raise UsageError(f"--diff: no launched run {wanted!r} in the history")
    if len({r["run"] for r in found}) > 1:
        names = ", ".join(sorted({str(r["run"]) for r in found})[:5])
        raise UsageError(f"--diff: {wanted!r} names several runs ({names}): give more of it")
    return found[0]


def run_diff(
    first: dict[str, Any], second: dict[str, Any], env: dict[str, Any] | None
) -> dict[str, Any]:
    """What changed from run `first` to run `second`: one entry per aspect that differs."""
    changes: list[dict[str, Any]] = []

    def compare(aspect: str, old: Any, new: Any) -> None:
        if old != new:
            changes.append({"aspect": aspect, "from": old, "to": new})

    compare("code", code_of(first), code_of(second))
    compare("source", describe_source(first.get("source")), describe_source(second.get("source")))
    compare("command", first.get("command"), second.get("command"))
    compare("overrides", describe_overrides(first), describe_overrides(second))
    env = env or {}
    for kind in ("added", "removed", "changed"):
        if env.get(kind):
            changes.append({"aspect": f"env {kind}", "names": list(env[kind])})
    return {
        "from": first["run"],
        "to": second["run"],
        "changes": changes,
        "env_known": bool(env.get("known")),
    }


def code_of(record: dict[str, Any]) -> str:
    release = record.get("release")
    if isinstance(release, dict) and release.get("id"):
        return f"release {release['id']}"
    return f"sha256 {str(record.get('sha256') or '?')[:12]}"


def diff_lines(diff: dict[str, Any]) -> list[str]:
    """`history --diff A B` for people (sanitised: it was read from the container)."""
    lines = [f"{diff.get('from')} -> {diff.get('to')}"]
    for change in diff.get("changes") or []:
        aspect = str(change.get("aspect"))
        if "names" in change:
            lines.append(f"  {aspect:<13}{', '.join(str(n) for n in change['names'])}")
        else:
            lines.append(
                f"  {aspect:<13}{change.get('from') or '-'}  ->  {change.get('to') or '-'}"
            )
    if not diff.get("changes"):
        lines.append("  no difference in code, command, environment or overrides")
    if not diff.get("env_known"):
        lines.append("  (env: a run's spec was not kept, so its values could not be compared)")
    return [sanitize(line, keep_sgr=False) for line in lines]


def history_lines(record: dict[str, Any]) -> list[str]:
    """A deploy record for people: one head line and the details under it.

    The record was read from the container, so every line is sanitised for a terminal.
    """
    marks = " [rollback]" if record.get("rollback") else ""
    if record.get("restarted_by"):
        marks += f" [restarted by {record['restarted_by']}]"
    head = (
        f"{record.get('time', '?')}  {record.get('outcome', '?')}  "
        f"sha256 {str(record.get('sha256') or '?')[:12]}  by {record.get('operator', '?')}{marks}"
    )
    lines = [head, f"  command      {record.get('command', '?')}"]
    release = record.get("release")
    if isinstance(release, dict):
        lines.append(
            f"  release      {release.get('id')} (manifest "
            f"{str(release.get('manifest_sha256') or '?')[:12]}, was {release.get('previous')})"
        )
    source = describe_source(record.get("source"))
    if source:
        lines.append(f"  source       {source}")
    told = describe_overrides(record)
    if told:
        lines.append(f"  overrides    {told}")
    if record.get("user") and record.get("client_host"):
        lines.append(f"  by           {record['user']} from {record['client_host']}")
    if record.get("message"):
        lines.append(f"  message      {record.get('message')}")
    if record.get("rollback_reason"):
        lines.append(f"  why          {record.get('rollback_reason')}")
    stopped = record.get("stopped") or {}
    if stopped.get("session_existed") or stopped.get("pids"):
        pids = ", ".join(str(p) for p in stopped.get("pids") or []) or "none"
        how = "forced" if stopped.get("forced") else "C-c"
        lines.append(f"  stopped      pids {pids} ({how})")
    else:
        lines.append("  stopped      nothing was running")
    ckpt = record.get("checkpoints") or {}
    action = ckpt.get("action")
    if action == "archive" and ckpt.get("to"):
        lines.append(f"  checkpoints  moved to {ckpt['to']}")
        for pruned in ckpt.get("pruned") or []:
            lines.append(f"  pruned       {pruned}")
    elif action == "restore":
        kept = ckpt.get("archived") or "none to set aside"
        lines.append(
            f"  checkpoints  {ckpt.get('from')} moved back in place (replaced run's: {kept})"
        )
    elif action == "purge":
        lines.append(f"  checkpoints  deleted {ckpt.get('from')}")
    elif action == "none":
        lines.append("  checkpoints  none to set aside")
    else:
        lines.append("  checkpoints  kept in place")
    now = checkpoints_now_text(record.get("checkpoints_now"))
    if now:
        lines.append(f"  its ckpts    {now}")
    return [sanitize(line, keep_sgr=False) for line in lines]


def checkpoints_now_text(now: Any) -> str:
    """Where a run's checkpoints are now (the agent follows every record to say it)."""
    if not isinstance(now, dict):
        return ""
    state, path, by = now.get("state"), now.get("path"), now.get("by")
    texts = {
        "live": f"in place at {path}",
        "archived": f"archived at {path}",
        "continued": f"left in place at {path} for run {by}",
        "restored": f"moved back to {path} for run {by}",
        "deleted": "deleted",
        "pruned": f"pruned ({path})",
        "gone": f"gone ({path} is not there any more)",
        "none": "none",
    }
    return texts.get(str(state), str(state))
