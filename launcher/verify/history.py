"""A run's history: its polls taken in order, every pane line once, for the checks to judge.

Polls overlap: each capture repeats part of the previous one. A `RunHistory` takes the polls one
at a time and keeps the run's own history (every line once, stamped with the time of the poll
that first showed it): the step and its cadence, the throughput and loss series, the queues'
readings, the restarts, the fatal signs and what followed them. It judges nothing: the checks
(`launcher.verify.rules`, listed in `launcher.verify.registry`) read it. Pure; no I/O.

Fatal signs in context: a fail pattern that ends the process (the pane dies, the run restarts, or
nothing advances the step afterwards) is fatal. A fail pattern after which the step advances is
a warning: the same process went on. Python's finaliser noise (`Exception ignored in: ...`
followed by a traceback) never ends anything and is a warning at once.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import median

from launcher.verify.lines import logical_lines
from launcher.verify.pane import Poll
from launcher.verify.rules.text import fmt
from launcher.verify.samples import Quantity, Sample
from launcher.verify.spec import ChecksSpec

__all__ = ["FatalSign", "Restart", "RunHistory", "Seen", "Series", "history"]


# --- history --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """A status line and the time of the poll that first showed it."""

    sample: Sample
    at: float


def history(polls: Sequence[Poll]) -> list[Seen]:
    """Every status line across polls once, in pane order, with the time it was first seen.

    Each poll resumes after the previous poll's last lines, found in the later capture (only
    the previous poll's newest few samples are needed, so callers may drop older ones). A
    previous last line that was cut off and now appears complete replaces its cut form. No match
    (the pane scrolled past, or was cleared) means every sample of the later poll is new.
    """
    merged: list[Seen] = []
    previous: tuple[Sample, ...] = ()
    for poll in polls:
        start, completed = _resume_point(previous, poll.samples)
        if completed and merged:
            merged[-1] = Seen(poll.samples[start - 1], merged[-1].at)
        merged.extend(Seen(sample, poll.at) for sample in poll.samples[start:])
        previous = poll.samples
    return merged


RESUME_CONTEXT = 3


def _resume_point(before: Sequence[Sample], after: Sequence[Sample]) -> tuple[int, bool]:
    """Where unseen samples start in `after`, and whether the match completed a cut-off line.

    Searches from the end, so identical repeated lines (a stalled trainer) count as seen.
    """
    if not before or not after:
        return 0, False
    tail = [sample.raw for sample in before[-RESUME_CONTEXT:]]
    for j in range(len(after) - 1, -1, -1):
        raw = after[j].raw
        exact = raw == tail[-1]
        if not exact and not raw.startswith(tail[-1]):
            continue
        if all(after[j - i].raw == tail[-1 - i] for i in range(1, len(tail)) if j - i >= 0):
            return j + 1, not exact
    return 0, False


# --- the run's timeline ---------------------------------------------------------------------

# One pane line: its text (right-stripped; indentation kept) and its sample, if it is a status line.
Entry = tuple[str, Sample | None]

# A torchrun rank that ended: "failed (exitcode: -9) local_rank: 0 (pid: 12) of binary: ..." or the
# error summary's "exitcode  : -9 (pid: 12)".
_RANK_EXIT_RE = re.compile(r"\bexitcode\s*:\s*(-?\d+)")
_TRACEBACK = "Traceback (most recent call last)"
_FINALISER = "Exception ignored in"
_BANNER_LINES = 8  # start-up lines remembered
_BANNER_SCAN = 60  # non-status lines before the first status line that may hold them
_SIGNS_KEPT = 100  # fatal signs remembered (finaliser noise can repeat all day)
_TAIL_MAX = 16  # lines a poll's resume point is found by, at most
_RECENT = 3  # readings that make the "current" level (a median: one outlier moves nothing)
_QUEUE_READINGS = 30  # readings per poll a queue is judged on
_KEEP = 20000  # readings kept per series (bounded memory on a long window)
_GAPS_KEPT = 20  # gaps between step changes the run's cadence is learnt from
# A poll passes only if the step changed within this many of the run's usual gaps (and never
# less than one poll interval): a run that moved every 0.3 s and then stopped is not
# progressing three polls later, however far `stall_after` still is.
CADENCE_MULTIPLE = 2.0
# Monotone counters that stand for the step in a format that prints none, in preference order:
# HF Trainer's dicts carry `epoch` (a float that grows every log), Megatron-style logs a count
# of consumed samples, others a count of tokens seen.
_COUNTERS = (
    "epoch",
    "consumed samples",
    "consumed_samples",
    "samples",
    "num_input_tokens_seen",
    "tokens",
)


def _entries(capture: str, samples: Sequence[Sample], width: int | None = None) -> list[Entry]:
    """The capture's non-blank lines in order, each status line paired with its sample.

    Samples are matched to lines by their text (a sample's `raw` is its line, perhaps without a
    prefix the parser removed); a sample no line holds is placed after the last matched one.
    """
    out: list[Entry] = []
    k, n = 0, len(samples)
    for line in logical_lines(capture, width=width):
        text = line.rstrip()
        if not text.strip():
            continue
        if k < n and _holds(text, samples[k].raw):
            out.append((text, samples[k]))
            k += 1
        elif k + 1 < n and _holds(text, samples[k + 1].raw):
            out.append((samples[k].raw, samples[k]))
            out.append((text, samples[k + 1]))
            k += 2
        else:
            out.append((text, None))
    out.extend((s.raw, s) for s in samples[k:])
    return out


def _tail_length(entries: Sequence[Entry]) -> int:
    """How many of the last lines a later poll resumes after: back to the last status line."""
    for back, (_, sample) in enumerate(reversed(entries[-_TAIL_MAX:])):
        if sample is not None:
            return max(RESUME_CONTEXT, back + 1)
    return _TAIL_MAX


def _holds(text: str, raw: str) -> bool:
    return raw == text or (bool(raw) and raw in text)


def _resume(previous: Sequence[str], texts: Sequence[str]) -> int | None:
    """Where the lines not seen by the previous poll start in `texts` (None: not found).

    The previous poll's last lines (back to its last status line, so that lines repeated
    word for word, like a traceback printed again and again, are told apart) are found in the
    new capture, searching from its end (so a stalled trainer's identical lines count as seen).
    The very last ones may have been redrawn since (a progress bar, a line cut off at the
    capture's end): if they are not found, the match is tried without them, and the redrawn
    lines count as new.
    """
    for drop in range(min(3, len(previous))):
        tail = previous[: len(previous) - drop]
        for j in range(len(texts) - 1, -1, -1):
            text = texts[j]
            if text != tail[-1] and not (drop == 0 and text.startswith(tail[-1])):
                continue
            if all(texts[j - i] == tail[-1 - i] for i in range(1, len(tail)) if j - i >= 0):
                # A line that was cut off and is now complete is new: its sample has more fields.
                return j if text != tail[-1] else j + 1
    return None


@dataclass
class Restart:
    at: float
    why: str
    before_probe: bool
    step_from: float | None = None
    step_to: float | None = None
    closed: bool = False

    def describe(self, start: float) -> str:
        back = (
            self.step_from is not None
            and self.step_to is not None
            and self.step_to < self.step_from
        )
        what = f"step {self.step_from} → {self.step_to}" if back else self.why
        when = "before the probe" if self.before_probe else f"at {self.at - start:.0f} s"
        return f"{what} {when}"


@dataclass
class FatalSign:
    line: str
    at: float
    step_before: float | None
    noise: bool = False  # finaliser noise: never fatal
    detail: str = ""  # a traceback's last line (the exception)
    outcome: str = "open"  # open | survived | ended
    step_after: float | None = None
    restart: Restart | None = None  # what ended it

    def describe(self) -> str:
        text = self.line.strip()
        if self.detail:
            text += f" … {self.detail.strip()}"
        return text


@dataclass
class Series:
    """Readings of one quantity, and which of them the latest poll brought."""

    values: deque[float] = field(default_factory=lambda: deque(maxlen=_KEEP))
    new: list[float] = field(default_factory=list)
    window: deque[float] = field(default_factory=lambda: deque(maxlen=_RECENT))
    smooth_max: float | None = None  # highest median of three consecutive readings
    smooth_min: float | None = None  # lowest median of three consecutive readings

    def add(self, value: float) -> None:
        self.values.append(value)
        self.new.append(value)
        self.window.append(value)
        if len(self.window) == _RECENT:
            a, b, c = self.window
            level = a + b + c - max(a, b, c) - min(a, b, c)  # the median of three, quickly
            self.smooth_max = level if self.smooth_max is None else max(self.smooth_max, level)
            self.smooth_min = level if self.smooth_min is None else min(self.smooth_min, level)

    def current(self) -> float | None:
        """The level now: the median of this poll's newest readings (or the last reading)."""
        recent = self.new[-_RECENT:]
        if recent:
            return median(recent)
        return self.values[-1] if self.values else None


class RunHistory:
    """A run's polls taken in order: what the checks judge (every line once, in pane order)."""

    def __init__(
        self,
        spec: ChecksSpec,
        *,
        live: bool = False,
        history_lines: int | None = None,
        interval: float | None = None,
    ) -> None:
        """`live`: more polls will follow, so a newest line that may be half printed can wait.

        `history_lines`: how many lines a capture asks for. A first capture that is shorter
        holds the pane from its start, so its lines before the first status line are the
        trainer's start-up lines (seen again, they mean a restart); a longer one may start
        anywhere, and nothing is learnt from it (None: captures are taken as whole).

        `interval`: the seconds between polls. With it, the step must have changed within the
        run's own cadence to pass (see `progress_window`); without it (one poll, or a report
        of a finished probe) only `stall_after` and `hang_after` judge the step.
        """
        self.spec = spec
        self.live = live
        self.history_lines = history_lines
        self.interval = interval
        self.start: float | None = None
        self.polls = 0
        self._previous: list[str] = []
        self._last: str | None = None  # the newest line at the last poll (not a status line)
        self._held: str | None = None  # that line, when it was not taken yet
        self._held_at = 0.0
        self._last_sample: str | None = None  # the text of the last status line taken
        self._pane_pid: int | None = None
        self.now = 0.0
        self.latest: Poll | None = None
        # step
        # The run's progress: its step or, for a format that prints none, a monotone counter it
        # does print (`_COUNTERS`, e.g. HF's epoch); `_progress_key` names which.
        self.progress_key = "step"
        self.step: float | None = None
        self._step_max: float | None = None
        self.gaps: deque[float] = deque(maxlen=_GAPS_KEPT)  # seconds between step changes
        self.step_first_at = 0.0
        self.step_first_min: float | None = None
        self.step_last_min: float | None = None
        self.changes = 0
        self.first_change_at = 0.0
        self.last_change_at = 0.0
        self._progressed = False  # a status line with a step was seen
        # numbers
        self.throughput = Series()
        self.loss = Series()
        self.loss_nonfinite = False
        self.unit = "tok/s"  # what the throughput counts, as the status format says
        self.loss_latest: float | None = None
        self.nonfinite: dict[str, str] = {}  # field -> value, in the latest sample
        self.queues: dict[str, deque[list[list[float]]]] = {
            name: deque(maxlen=spec.failure_threshold) for name in spec.queues
        }
        self.queue_latest: dict[str, list[float] | None] = dict.fromkeys(spec.queues)
        # How each queue prints (`Sample.queue`): buckets, depth or fill; None until read.
        self.queue_kind: dict[str, str | None] = dict.fromkeys(spec.queues)
        self.new_samples: list[Sample] = []  # the status lines the latest poll brought
        self._recent: deque[Sample] = deque(maxlen=8)
        self.formats: set[str] = set()  # the formats the run's status lines were read in
        self.reported: set[str] = set()  # the quantities some status line carried
        self.warmup_over = True  # as the latest judgement was asked (a fatal sign's grace)
        # events
        self.restarts: list[Restart] = []
        self.fatal: list[FatalSign] = []
        self._open: list[FatalSign] = []  # fatal signs nothing has followed yet
        self._banner: list[str] = []
        self._banner_known = False  # the first capture showed the pane from its start
        self._banner_scanned = 0
        self._banner_hits: set[str] = set()
        self._traceback: FatalSign | None = None  # inside a traceback block
        self._finaliser = False  # inside an `Exception ignored in` block

    # -- intake ---------------------------------------------------------------------------

    def take(self, poll: Poll) -> None:
        """Take one poll into the history."""
        if self.start is None:
            self.start = poll.at
            lines = self.history_lines
            self._banner_known = lines is None or poll.state.capture.count("\n") + 1 < lines
        self.now = poll.at
        self.latest = poll
        self.throughput.new.clear()
        self.loss.new.clear()
        self.new_samples = []
        pid = poll.state.pane_pid
        if pid is not None and self._pane_pid is not None and pid != self._pane_pid:
            self._restart(f"new process behind the pane (pid {self._pane_pid} → {pid})")
        if pid is not None:
            self._pane_pid = pid
        entries = _entries(poll.state.capture, poll.samples, poll.state.pane_width)
        # The newest line may still be being written (a capture can catch it half printed):
        # unless it is a status line, the pane is dead, or it was already the newest line at the
        # last poll, it is taken at the next poll (as first seen then).
        last = entries[-1][0] if entries and entries[-1][1] is None else None
        hold = self.live and last is not None and not poll.state.pane_dead and last != self._last
        held, held_at = self._held, self._held_at
        self._last = last
        self._held, self._held_at = (last, poll.at) if hold else (None, poll.at)
        if hold:
            entries = entries[:-1]
        texts = [text for text, _ in entries]
        for text, sample in entries[self._resume_point(texts) :]:
            if sample is not None:
                self._on_sample(sample)
                self._last_sample = text
                continue
            if text == held:
                self.now, held = held_at, None
            self._on_line(text)
            self.now = poll.at
        if texts or not hold:
            self._previous = texts[-_tail_length(entries) :]
        if poll.samples:
            self.nonfinite = _nonfinite_fields(poll.samples[-1])
        self._take_queues()
        self.polls += 1

    def _resume_point(self, texts: Sequence[str]) -> int:
        """Where this capture's unseen lines start (see `_resume`).

        When the previous poll's last lines are not found (a live display redrawn in place
        below the status lines), the last status line taken is looked for instead: seeing old
        status lines again would read as the step going backwards.
        """
        start = _resume(self._previous, texts)
        if start is not None:
            return start
        for j in range(len(texts) - 1, -1, -1):
            if texts[j] == self._last_sample:
                return j + 1
        return 0  # the pane was cleared, or scrolled past more than a capture: all is new

    def _on_sample(self, sample: Sample) -> None:
        self._banner_hits.clear()
        self._traceback, self._finaliser = None, False  # a status line ends any traceback
        self.new_samples.append(sample)
        self.formats.add(sample.reading.format)
        step = sample.step
        if step is not None:
            if self.progress_key != "step":
                self._restart_progress("step")
            self.reported.add("step")
            self._on_step(step, sample)
        elif self.progress_key != "step" or "step" not in self.reported:
            counter = _counter(sample)
            if counter is not None:
                if counter[0] != self.progress_key:
                    self._restart_progress(counter[0])
                self.reported.add("step")
                self._on_step(counter[1], sample)
        if sample.reading.format != "dflash":  # a DFlash line always carries them
            fields = sample.fields
            self.reported.update(f"queues.{q}" for q in self.spec.queues if q in fields)
            if "throughput" in fields:
                self.reported.add("throughput")
        throughput = sample.throughput
        if throughput is not None and math.isfinite(throughput):
            self.throughput.add(throughput)
            self.unit = sample.throughput_unit
        loss = sample.loss
        if loss is not None:
            self.loss_latest = loss
            if math.isfinite(loss):
                self.loss.add(loss)
            else:
                self.loss_nonfinite = True
        self._recent.append(sample)

    def _take_queues(self) -> None:
        """Each queue's readings in this poll's newest status lines (or the last one known)."""
        recent = self.new_samples[-_QUEUE_READINGS:]
        for name, polls in self.queues.items():
            found = [v for s in recent if (v := s.queue(name)) is not None]
            if found:
                kind = found[-1][0]  # a queue printed two ways: its latest way is judged
                readings = [values for k, values in found if k == kind]
                self.queue_kind[name] = kind
            else:
                older = self.new_samples[: -_QUEUE_READINGS or None]
                latest_found = next((v for s in reversed(older) if (v := s.queue(name))), None)
                if latest_found is not None:
                    self.queue_kind[name] = latest_found[0]
                latest = latest_found[1] if latest_found else self.queue_latest[name]
                readings = [latest] if latest is not None else []  # nothing new: it holds
            if readings:
                self.queue_latest[name] = readings[-1]
            polls.append(readings)

    def _new_epoch(self, sample: Sample) -> bool:
        """Whether the epoch's integer part went up with this sample (read only when needed)."""
        epoch = sample.number("epoch")
        if epoch is None:
            return False
        before = next(
            (e for s in reversed(self._recent) if (e := s.number("epoch")) is not None), None
        )
        return before is not None and math.floor(epoch) > math.floor(before)

    @property
    def poll(self) -> Poll:
        """The latest poll: the checks run only once there is one."""
        assert self.latest is not None
        return self.latest

    @property
    def progress(self) -> str | None:
        """The run's progress as last seen (`step 120`, `epoch 1.89`); None before any."""
        return None if self.step is None else f"{self.progress_key} {fmt(self.step)}"

    def _restart_progress(self, key: str) -> None:
        """Progress is now read from another quantity (the bar appeared above HF's dicts):
        its values are not comparable with the old one's, so its timeline starts afresh."""
        self.progress_key = key
        self.step = self._step_max = None
        self.gaps.clear()
        self.changes = 0

    def _on_step(self, step: float, sample: Sample) -> None:
        at, minute = self.now, sample.elapsed_min
        restart = self._open_restart()
        # Ranks printing in turn may lag a step behind each other: two steps back is a restart,
        # unless the counter restarts with each epoch.
        behind = self._step_max is not None and step < self._step_max - 1
        new_epoch = behind and self._new_epoch(sample)
        if new_epoch:
            self._step_max = None  # a counter that restarts with each epoch: counted afresh
        backwards = behind and not new_epoch
        if restart is not None or backwards:
            if restart is None:
                restart = self._restart("the step went backwards")
            restart.step_from, restart.step_to = self._step_max, step
            restart.closed = True
            self._step_max = step
        for sign in self._open:
            if sign.step_before is None or step > sign.step_before:
                sign.outcome, sign.step_after = "survived", step
        self._open = [sign for sign in self._open if sign.outcome == "open"]
        if step != self.step:
            if self.step is not None:
                if at > self.step_first_at:
                    # Seen at a later poll than the previous step: one gap of the cadence.
                    self.gaps.append(at - self.step_first_at)
                self.changes += 1
                if self.changes == 1:
                    self.first_change_at = at
                self.last_change_at = at
            self.step, self.step_first_at, self.step_first_min = step, at, minute
        self.step_last_min = minute
        self._step_max = step if self._step_max is None else max(self._step_max, step)
        self._progressed = True

    def _on_line(self, text: str) -> None:
        stripped = text.strip()
        indented = text[:1].isspace()
        if self._block(stripped, indented):
            return
        if not self._progressed:
            if self._banner_known:
                self._learn_banner(stripped, indented)
        elif stripped in self._banner:
            self._banner_hits.add(stripped)
            if self._banner_repeated() and self._open_restart() is None:
                self._restart(f"start-up lines repeated ({self._banner[0]!r})")
        if any(p in stripped for p in self.spec.restart_patterns):
            if self._open_restart() is None:
                self._restart(f"supervisor restart: {stripped[:80]}")
            return
        rank = _RANK_EXIT_RE.search(stripped)
        if (rank and rank[1] != "0") or any(p in stripped for p in self.spec.fail_patterns):
            sign = FatalSign(stripped, self.now, self.step)
            self._keep(sign)
            self._open.append(sign)
            if stripped.startswith(_TRACEBACK):
                self._traceback = sign

    def _keep(self, sign: FatalSign) -> None:
        """Remember a fatal sign; past _SIGNS_KEPT, the oldest harmless one is forgotten."""
        self.fatal.append(sign)
        if len(self.fatal) > _SIGNS_KEPT:
            harmless = next(
                (i for i, s in enumerate(self.fatal[:-1]) if s.noise or s.outcome == "survived"),
                0,
            )
            del self.fatal[harmless]

    def _banner_repeated(self) -> bool:
        """The first start-up line, and one more when there are more, printed again."""
        hits = self._banner_hits
        return self._banner[0] in hits and len(hits) >= min(2, len(self._banner))

    def _block(self, stripped: str, indented: bool) -> bool:
        """Follow a traceback block; True when the line belongs to one (and is handled)."""
        if stripped.startswith(_FINALISER):
            self._finaliser, self._traceback = True, None
            self._keep(FatalSign(stripped, self.now, self.step, noise=True))
            return True
        if self._finaliser:
            if stripped.startswith(_TRACEBACK) or indented:
                return True
            self._finaliser = False  # the exception line ends the block
            self.fatal[-1].detail = stripped
            return True
        if self._traceback is not None:
            if indented or stripped.startswith("File "):
                return True
            if stripped.startswith(("During handling of", "The above exception", _TRACEBACK)):
                return True  # chained tracebacks: the same fatal sign
            self._traceback.detail = stripped
            self._traceback = None
            return True
        return False

    def _learn_banner(self, stripped: str, indented: bool) -> None:
        self._banner_scanned += 1
        if (
            self._banner_scanned > _BANNER_SCAN
            or len(self._banner) >= _BANNER_LINES
            or indented
            or len(stripped) < 6
            or stripped in self._banner
            or stripped.startswith(("Pane is dead", "==="))
            or any(p in stripped for p in self.spec.fail_patterns)
        ):
            return
        self._banner.append(stripped)

    def _open_restart(self) -> Restart | None:
        last = self.restarts[-1] if self.restarts else None
        return last if last is not None and not last.closed else None

    def _restart(self, why: str) -> Restart:
        restart = Restart(self.now, why, before_probe=self.polls == 0)
        self.restarts.append(restart)
        for sign in self._open:
            sign.outcome, sign.restart = "ended", restart  # the process that printed it is gone
        self._open = []
        return restart

    def forgiven(self) -> bool:
        """One restart, before the probe began (a resume at the start): a warning only."""
        return len(self.restarts) == 1 and self.restarts[0].before_probe

    def cadence(self) -> float | None:
        """Seconds between the step's changes, on average (None until it changed twice)."""
        if self.changes < 2:
            return None
        return (self.last_change_at - self.first_change_at) / (self.changes - 1)

    def progress_window(self) -> float | None:
        """Seconds within which the step must have changed for a poll to pass: a small
        multiple of the run's usual gap between changes (the median of the last ones seen at
        different polls: one long checkpoint save moves nothing), never less than one poll
        interval. Before any gap is known, that multiple of the interval. None without polls
        at a known interval (a single poll is judged by `stall_after` alone)."""
        if self.interval is None:
            return None
        typical = median(self.gaps) if self.gaps else self.interval
        return max(CADENCE_MULTIPLE * typical, self.interval)


def _counter(sample: Sample) -> tuple[str, float] | None:
    """The first finite monotone counter the sample carries (see `_COUNTERS`)."""
    for key in _COUNTERS:
        value = sample.number(key)
        if value is not None and math.isfinite(value):
            return key, value
    return None


# Fields whose infinity means "not known yet" rather than a broken run.
_NOT_HEALTH = re.compile(r"(?i)^(eta|remaining|time_?left|loss)$")


def _nonfinite_fields(sample: Sample) -> dict[str, str]:
    """Numbers in the sample that are nan or inf: the fields its format watches, and any other."""
    found = {
        name: str(value)
        for name, value in sample.watched().items()
        if value is not None and not math.isfinite(value) and not _NOT_HEALTH.match(name)
    }
    raw = sample.raw.lower()
    if "nan" not in raw and "inf" not in raw:
        return found
    for key in sample.fields:
        if _NOT_HEALTH.match(key):
            continue
        value = sample.fields.get(key)
        number = value.value if isinstance(value, Quantity) else value
        if type(number) is float and not math.isfinite(number):
            found[key] = str(number)
    return found
