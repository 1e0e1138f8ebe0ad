"""What a watcher remembers across its own restarts (systemd's Restart=, a reboot).

One JSON file per inventory under the user's state directory ($XDG_STATE_HOME/launcher/watch/,
or ~/.local/state/launcher/watch/), written atomically after every change: each target's last
known run and status and the restarts made for it (so a restarted watcher neither reports a
transition again nor forgets how many restarts the window has left), and the outbox, the
notifications not yet delivered to every destination. An events log (`.events.jsonl`) next to
it keeps every event. An exclusive lock stops a second watcher on the same file.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import stat
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from launcher.core.errors import RefusedError, UsageError
from launcher.watch.events import Event

# Delivered events are forgotten; undelivered ones are kept up to this many (the oldest go).
OUTBOX_LIMIT = 500


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "launcher" / "watch"


def default_state_path(inventory: Path) -> Path:
    """One state file per inventory (two inventories watched side by side do not mix)."""
    key = hashlib.sha256(str(inventory.resolve()).encode()).hexdigest()[:12]
    return state_dir() / f"{inventory.stem}-{key}.json"


STATE_LIMIT = 64 << 20  # a state file larger than this is not one a watcher wrote


def open_private(path: Path, mode: str) -> IO[str]:
    """Open (creating) `path` readable by its owner only, also when it existed with 0644."""
    flags = os.O_CREAT | (os.O_RDWR if "+" in mode else os.O_WRONLY)
    flags |= os.O_APPEND if mode.startswith("a") else 0
    fd = os.open(path, flags | os.O_CLOEXEC, 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        os.fchmod(fd, 0o600)
        return os.fdopen(fd, mode, encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def _typed(record: Any) -> Any:
    """`record` with every field of the type its dataclass declares (a hand-edited or damaged
    state file fails here, as a usage error, not as a TypeError in a watcher thread later)."""
    checks: dict[str, Any] = {
        "run": (str, type(None)),
        "gave_up_run": (str, type(None)),
        "status": str,
        "reachable": bool,
        "bad": bool,
        "restarts": list,
        "event": dict,
        "destinations": list,
    }
    for name in record.__dataclass_fields__:
        value = getattr(record, name)
        if name in checks and not isinstance(value, checks[name]):
            raise ValueError(f"{name} is {type(value).__name__}")
    for item in getattr(record, "restarts", ()):
        if isinstance(item, bool) or not isinstance(item, int | float):
            raise ValueError("restarts holds a non-number")
    for item in getattr(record, "destinations", ()):
        if not isinstance(item, str):
            raise ValueError("destinations holds a non-string")
    return record


@dataclass
class TargetRecord:
    run: str | None = None
    status: str = "starting"
    reachable: bool = True
    restarts: list[float] = field(default_factory=list)  # epoch seconds of the watcher's restarts
    gave_up_run: str | None = None  # the run left stopped (not restarted again)
    # The run the watcher itself deployed last: its restarts count against the same budget.
    # Any other new run (a person's deploy) starts with a fresh budget.
    launched: str | None = None
    bad: bool = False  # unhealthy since the last healthy verdict (its end is "recovered")


@dataclass
class _Pending:
    event: dict[str, Any]
    destinations: list[str]


class WatchState:
    """The persisted state; every method is thread-safe and saves before it returns."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events_path = path.with_suffix(".events.jsonl")
        self._lock = threading.Lock()
        self._flock: IO[str] | None = None
        self.targets: dict[str, TargetRecord] = {}
        self._outbox: dict[str, _Pending] = {}

    # -- lifetime -------------------------------------------------------------------------

    def open(self) -> WatchState:
        """Take the file's lock (refused, exit 4, if another watcher holds it) and load it."""
        try:
            # The events hold pane lines and the outbox the destinations: owner only.
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            if self.path.parent == state_dir():
                os.chmod(self.path.parent, 0o700)  # made by an earlier version with 0755
            handle = open_private(self.path.with_suffix(".lock"), "a+")
        except OSError as exc:
            raise UsageError(f"watch state {self.path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            raise RefusedError(
                f"another watcher uses the state file {self.path}",
                hint="stop it first, or give this one its own file with --state",
            ) from None
        self._flock = handle
        self._load()
        return self

    def close(self) -> None:
        if self._flock is not None:
            self._flock.close()
            self._flock = None

    def _load(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as handle:
                if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                    raise ValueError("not a regular file")
                text = handle.read(STATE_LIMIT + 1)
            if len(text) > STATE_LIMIT:
                raise ValueError(f"larger than {STATE_LIMIT} bytes")
            data = json.loads(text)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise UsageError(
                f"watch state {self.path} cannot be read ({exc}); move it away to start afresh"
            ) from None
        try:
            self.targets = {
                str(name): _typed(TargetRecord(**record))
                for name, record in data.get("targets", {}).items()
            }
            self._outbox = {
                str(key): _typed(_Pending(**entry)) for key, entry in data.get("outbox", {}).items()
            }
            for pending in self._outbox.values():
                Event.from_json(pending.event)
        except (TypeError, AttributeError, ValueError) as exc:
            raise UsageError(
                f"watch state {self.path} has an unknown layout ({exc}); move it away"
            ) from None

    def _save(self) -> None:
        doc = {
            "version": 1,
            "targets": {name: asdict(record) for name, record in self.targets.items()},
            "outbox": {key: asdict(entry) for key, entry in self._outbox.items()},
        }
        tmp = self.path.with_suffix(".tmp")
        with open_private(tmp, "w") as handle:
            handle.truncate()
            handle.write(json.dumps(doc, indent=1, sort_keys=True))
        os.replace(tmp, self.path)

    # -- targets --------------------------------------------------------------------------

    def record(self, target: str) -> TargetRecord:
        with self._lock:
            found = self.targets.get(target)
            return TargetRecord(**asdict(found)) if found else TargetRecord()

    def update(self, target: str, record: TargetRecord) -> None:
        with self._lock:
            self.targets[target] = TargetRecord(**asdict(record))
            self._save()

    # -- events and the outbox ------------------------------------------------------------

    def add_event(self, event: Event, destinations: list[str]) -> None:
        """Log the event and, when it is to be sent, queue it for every destination."""
        with self._lock:
            with open_private(self.events_path, "a") as log:
                log.write(json.dumps(event.to_json(), sort_keys=True) + "\n")
            if destinations:
                self._outbox[event.id] = _Pending(event.to_json(), list(destinations))
                while len(self._outbox) > OUTBOX_LIMIT:
                    del self._outbox[next(iter(self._outbox))]
            self._save()

    def delivered(self, event_id: str, destination: str) -> None:
        """One destination has the event (or gave up on it): never send it there again."""
        with self._lock:
            entry = self._outbox.get(event_id)
            if entry is None or destination not in entry.destinations:
                return
            entry.destinations.remove(destination)
            if not entry.destinations:
                del self._outbox[event_id]
            self._save()

    def undelivered(self) -> list[tuple[Event, list[str]]]:
        """What an earlier watcher queued and could not deliver, oldest first."""
        with self._lock:
            return [
                (Event.from_json(entry.event), list(entry.destinations))
                for entry in self._outbox.values()
            ]
