"""CI without glue: under GitHub Actions (GITHUB_ACTIONS=true) a command ends by writing its
result to the job summary ($GITHUB_STEP_SUMMARY) and an `::error::` annotation per failed
target, so a workflow needs no script of its own to show why a job failed.

Workflow commands are read from stderr as from stdout (the runner handles both streams the same
way), and stderr keeps `--json > file` clean. Escaping as GitHub documents it for workflow
commands: `%`, CR and LF in the message; `:` and `,` too in a property.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from launcher.core.errors import ExitCode
from launcher.output.termsafe import sanitize
from launcher.targets.fleet import Outcome


def _data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _property(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _reason(outcome: Outcome) -> str:
    return sanitize(outcome.error or outcome.summary, keep_sgr=False)


def _failing_checks(outcome: Outcome) -> list[tuple[str, str]]:
    """(check, its evidence's first line) of each failing check of a probe, if any."""
    from launcher.verify.prober import ProbeResult
    from launcher.verify.results import Verdict

    probe = outcome.data.get("probe")
    if not isinstance(probe, ProbeResult):
        return []
    return [
        (r.name, sanitize((r.observed.splitlines() or [""])[0], keep_sgr=False))
        for r in probe.checks
        if r.verdict is Verdict.FAIL
    ]


def error_annotations(command: str, outcomes: Sequence[Outcome]) -> list[str]:
    lines = []
    for outcome in outcomes:
        if outcome.exit_code == ExitCode.OK:
            continue
        title = _property(f"launcher {command}: {outcome.target} {outcome.result}")
        lines.append(f"::error title={title}::{_data(_reason(outcome))}")
    return lines


def summary(command: str, outcomes: Sequence[Outcome]) -> str:
    failed = sum(o.exit_code != ExitCode.OK for o in outcomes)
    state = "all passed" if not failed else f"{failed} of {len(outcomes)} failed"
    rows = [
        f"### launcher {command}: {state}",
        "",
        "| target | result | exit | reason |",
        "|---|---|---|---|",
    ]
    details: list[str] = []
    for outcome in outcomes:
        mark = "✅" if outcome.exit_code == ExitCode.OK else "❌"
        rows.append(
            f"| {_cell(outcome.target)} | {mark} {outcome.result} | {int(outcome.exit_code)} "
            f"| {_cell(_reason(outcome))} |"
        )
        for check, evidence in _failing_checks(outcome):
            details.append(f"- **{_cell(outcome.target)}** `{check}`: {_cell(evidence)}")
    if details:
        rows += ["", "Failing checks:", "", *details]
    return "\n".join(rows) + "\n\n"


def report(command: str, outcomes: Sequence[Outcome]) -> None:
    """Under GitHub Actions: the annotations on stderr and the summary appended to the job's."""
    if os.environ.get("GITHUB_ACTIONS") != "true" or not outcomes:
        return
    for line in error_annotations(command, outcomes):
        print(line, file=sys.stderr, flush=True)
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(summary(command, outcomes))
    except OSError as exc:  # a summary is a courtesy: the command's own result stands
        print(f"warning: cannot write the job summary {path}: {exc}", file=sys.stderr)
