"""The events a watcher reports: one per transition, in a documented, versioned JSON schema.

Schema `launcher.watch.event/1` (fields are only ever added within a version):

    schema      "launcher.watch.event/1"
    id          unique id of this event (a receiver may deduplicate on it)
    time        ISO 8601 UTC time the watcher noticed the transition
    kind        new_run | healthy | unhealthy | recovered | unreachable | reachable |
                restart | gave_up | finished (the run exited 0: never restarted) |
                stopped (`launcher stop` ended it: not restarted) | paused (the CT is
                frozen or locked by a backup: the run is paused, not down; never restarted) |
                resumed (answering again after a pause)
    target, host, vmid
    run         the run marker of the run concerned (null for a session launcher did not start)
    status      the target's status after the event: starting | healthy | unhealthy |
                unreachable | restarting | stopped | finished | failed (the run exited
                non-zero)
    previous    the status before it
    reason      one line: why (the failing checks and their evidence)
    last_lines  the pane's last lines at the time (at most 15)
    step        the newest step seen (null if none)
    restarts    restarts the watcher made in the current restart window
    text        one Slack-compatible line summarising all of the above
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

SCHEMA = "launcher.watch.event/1"
KINDS = (
    "new_run",
    "healthy",
    "unhealthy",
    "recovered",
    "unreachable",
    "reachable",
    "restart",
    "gave_up",
    "finished",
    "stopped",
    "paused",
    "resumed",
)
# Noticed and recorded, but not worth waking anyone: a run that became healthy as expected.
QUIET_KINDS = frozenset({"healthy"})
LAST_LINES = 15
# What a notification carries of one pane line and of the reason: a crash can print a line of
# hundreds of KB, which would make every --exec fail ("Argument list too long") and every
# webhook body huge. The cut is marked, so nobody mistakes it for the whole line.
LINE_LIMIT = 2000
REASON_LIMIT = 4000


def cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [cut: {len(text) - limit} more characters]"


_ICONS = {
    "new_run": "🆕",
    "healthy": "✅",
    "recovered": "✅",
    "unhealthy": "🔴",
    "unreachable": "⚠️",
    "reachable": "🔌",
    "restart": "🔁",
    "gave_up": "⛔",
    "finished": "🏁",
    "stopped": "⏹️",
    "paused": "⏸️",
    "resumed": "▶️",
}


@dataclass(frozen=True)
class Event:
    kind: str
    target: str
    host: str
    vmid: int
    run: str | None
    status: str
    previous: str
    reason: str
    last_lines: list[str] = field(default_factory=list)
    step: int | None = None
    restarts: int = 0
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    time: str = field(
        default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds")
    )

    @property
    def text(self) -> str:
        """One line for chat (Slack's `text`), terminal and logs alike."""
        icon = _ICONS.get(self.kind, "•")
        where = f"{self.target} (CT {self.vmid} on {self.host})"
        run = f" run {self.run}" if self.run else ""
        step = f", step {self.step}" if self.step is not None else ""
        return f"{icon} {where}{run}: {self.kind.replace('_', ' ')}{step} — {self.reason}"

    def capped(self) -> Event:
        """This event with its reason and pane lines cut to their limits (the cut marked)."""
        lines = [cut(line, LINE_LIMIT) for line in self.last_lines[-LAST_LINES:]]
        if lines == self.last_lines and len(self.reason) <= REASON_LIMIT:
            return self
        return replace(self, reason=cut(self.reason, REASON_LIMIT), last_lines=lines)

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        return {"schema": SCHEMA, **body, "text": self.text}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Event:
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in names})

    def environment(self) -> dict[str, str]:
        """The event as environment variables for `--exec` (LAUNCHER_EVENT is the JSON)."""
        import json

        return {
            "LAUNCHER_EVENT": json.dumps(self.to_json(), sort_keys=True),
            "LAUNCHER_EVENT_SCHEMA": SCHEMA,
            "LAUNCHER_EVENT_ID": self.id,
            "LAUNCHER_EVENT_KIND": self.kind,
            "LAUNCHER_EVENT_TIME": self.time,
            "LAUNCHER_EVENT_TARGET": self.target,
            "LAUNCHER_EVENT_HOST": self.host,
            "LAUNCHER_EVENT_VMID": str(self.vmid),
            "LAUNCHER_EVENT_RUN": self.run or "",
            "LAUNCHER_EVENT_STATUS": self.status,
            "LAUNCHER_EVENT_PREVIOUS": self.previous,
            "LAUNCHER_EVENT_REASON": self.reason,
            "LAUNCHER_EVENT_STEP": "" if self.step is None else str(self.step),
            "LAUNCHER_EVENT_TEXT": self.text,
        }
