"""Health checks: pane state and parsed status lines in, verdicts out. Pure; no I/O.

Polls overlap: each capture repeats part of the previous one. A `Judge` takes the polls one at a
time and keeps the run's own history (every line once, stamped with the time of the poll that
first showed it): the throughput peak, the lowest loss, the restarts, the fatal signs and what
followed them. Each poll is then judged against that history.

How a failing check counts (`Failure`) towards a verdict is the policy's: `launcher.verify.policy`.

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

from pydantic import BaseModel, Field, StrictInt, field_validator

from launcher.verify.gpus import GpuCheckSpec, GpuSample
from launcher.verify.gpus import judge as judge_gpus
from launcher.verify.parse import Quantity, Sample, clean_text, logical_lines, parse_rate
from launcher.verify.results import CheckResult, Failure, Verdict, worst_verdict

__all__ = [
    "CheckResult",
    "ChecksSpec",
    "Failure",
    "Judge",
    "LossSpec",
    "PaneState",
    "Poll",
    "Seen",
    "StepSpec",
    "ThroughputSpec",
    "Verdict",
    "evaluate",
    "fatal_signs",
    "history",
    "worst_verdict",
]


@dataclass(frozen=True)
class PaneState:
    """What one poll of the trainer's tmux pane returns."""

    session_exists: bool
    pane_dead: bool
    dead_status: int | None
    exit_code: int | None
    capture: str
    pane_pid: int | None = None  # the process tmux started in the pane
    run: str | None = None  # the run marker each deploy sets (tmux option @launcher_run)
    deploy_lock: str | None = None  # who holds the container's deploy lock, when someone does
    # The pane's width: rows of a capture are re-joined only where they were wrapped at it.
    pane_width: int | None = None
    # Seconds the run has printed nothing (its log unwritten) and written nothing below its
    # checkpoints directory, as the container's clock has it; None: not known (no log).
    quiet_for: float | None = None
    # Seconds since the session was created (the container's clock); None: not known.
    age: float | None = None
    # The run was stopped by `launcher stop` (or a watcher that gave up), not ended by itself.
    stopped: bool = False
    gpus: GpuSample | None = None  # the run's GPUs, when the playbook gives it some


@dataclass(frozen=True)
class Poll:
    at: float  # monotonic seconds
    state: PaneState
    samples: tuple[Sample, ...]


class ThroughputSpec(BaseModel, extra="forbid", allow_inf_nan=False):
    min: float = Field(default=1000.0, ge=0)  # tok/s; "5Ktok/s" is accepted too
    target: float | None = Field(default=None, ge=0)
    rise_margin: float = Field(default=0.05, ge=0)  # later must beat earlier by this fraction
    # Failing below this fraction of the run's own peak; null: no such check.
    drop: float | None = Field(default=0.5, gt=0, lt=1)

    @field_validator("min", "target", mode="before")
    @classmethod
    def _rate(cls, value: object) -> object:
        return parse_rate(value) if isinstance(value, str) else value


class StepSpec(BaseModel, extra="forbid", allow_inf_nan=False):
    stall_after: float = Field(default=120.0, gt=0)  # seconds
    # Hung sooner: the step unchanged, nothing printed and nothing written below the checkpoints
    # directory for this long (seconds). A checkpoint save that writes as it goes, however long,
    # is not silent; one that prints nothing and writes nothing is. None: no such check.
    hang_after: float | None = Field(default=None, gt=0)


class LossSpec(BaseModel, extra="forbid", allow_inf_nan=False):
    warn_rise: float = Field(default=0.5, ge=0)  # fraction above the lowest loss seen
    # Failing this fraction above the lowest (smoothed) loss seen; null: no such check.
    max_rise: float | None = Field(default=1.0, gt=0)
    # The loss of a model that predicts nothing (e.g. ln(vocabulary size)); null: unknown.
    ceiling: float | None = Field(default=None, gt=0)


class ChecksSpec(BaseModel, extra="forbid", allow_inf_nan=False):
    fail_patterns: list[str] = Field(
        default_factory=lambda: [
            "Traceback (most recent call last)",
            "CUDA out of memory",
            "OutOfMemoryError",
            "NCCL error",
            "Killed",
        ]
    )
    # Lines a supervisor prints when it restarts the trainer (torchrun's elastic agent).
    restart_patterns: list[str] = Field(
        default_factory=lambda: ["will restart worker group", "Restarting worker group"]
    )
    queues: dict[str, int] = Field(default_factory=lambda: {"q_pre": 6, "q_hs": 1})
    throughput: ThroughputSpec = Field(default_factory=ThroughputSpec)
    step: StepSpec = Field(default_factory=StepSpec)
    loss: LossSpec = Field(default_factory=LossSpec)
    # Failing polls in a row that end the probe (Kubernetes' failureThreshold).
    failure_threshold: StrictInt = Field(default=3, ge=1, le=1000)
    gpus: GpuCheckSpec = Field(default_factory=GpuCheckSpec)


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
_CEILING_NEAR = 0.9  # "near the ceiling": at or above this fraction of it
# A training loss that reads exactly 0 this many times in a row is not learning but broken: Hugging
# Face's Trainer (logging_nan_inf_filter=True, its default) drops NaN steps from the logged sum,
# so a run whose every step is NaN logs 'loss': 0.0 (transformers' Trainer._inner_training_loop).
_ZERO_LOSS_READINGS = 3
_FLOOR_RISE = 0.2  # below the floor, "still rising" needs this much over the earlier half
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
class _Restart:
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
class _FatalSign:
    line: str
    at: float
    step_before: float | None
    noise: bool = False  # finaliser noise: never fatal
    detail: str = ""  # a traceback's last line (the exception)
    outcome: str = "open"  # open | survived | ended
    step_after: float | None = None
    restart: _Restart | None = None  # what ended it

    def describe(self) -> str:
        text = self.line.strip()
        if self.detail:
            text += f" … {self.detail.strip()}"
        return text


@dataclass
class _Series:
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


class Judge:
    """Takes a run's polls in order and judges each against the run's history so far."""

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
        run's own cadence to pass (see `_progress_window`); without it (one poll, or a report
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
        self._now = 0.0
        self._latest: Poll | None = None
        # step
        # The run's progress: its step or, for a format that prints none, a monotone counter it
        # does print (`_COUNTERS`, e.g. HF's epoch); `_progress_key` names which.
        self._progress_key = "step"
        self._step: float | None = None
        self._step_max: float | None = None
        self._gaps: deque[float] = deque(maxlen=_GAPS_KEPT)  # seconds between step changes
        self._step_first_at = 0.0
        self._step_first_min: float | None = None
        self._step_last_min: float | None = None
        self._changes = 0
        self._first_change_at = 0.0
        self._last_change_at = 0.0
        self._progressed = False  # a status line with a step was seen
        # numbers
        self._throughput = _Series()
        self._loss = _Series()
        self._loss_nonfinite = False
        self._unit = "tok/s"  # what the throughput counts, as the status format says
        self._loss_latest: float | None = None
        self._nonfinite: dict[str, str] = {}  # field -> value, in the latest sample
        self._queues: dict[str, deque[list[list[float]]]] = {
            name: deque(maxlen=spec.failure_threshold) for name in spec.queues
        }
        self._queue_latest: dict[str, list[float] | None] = dict.fromkeys(spec.queues)
        self._new_samples: list[Sample] = []  # the status lines the latest poll brought
        self._recent: deque[Sample] = deque(maxlen=8)
        self._formats: set[str] = set()  # the formats the run's status lines were read in
        self._reported: set[str] = set()  # the quantities some status line carried
        self._warmup_over = True
        # events
        self.restarts: list[_Restart] = []
        self.fatal: list[_FatalSign] = []
        self._open: list[_FatalSign] = []  # fatal signs nothing has followed yet
        self._banner: list[str] = []
        self._banner_known = False  # the first capture showed the pane from its start
        self._banner_scanned = 0
        self._banner_hits: set[str] = set()
        self._traceback: _FatalSign | None = None  # inside a traceback block
        self._finaliser = False  # inside an `Exception ignored in` block

    # -- intake ---------------------------------------------------------------------------

    def add(self, poll: Poll, *, warmup_over: bool = True) -> list[CheckResult]:
        """Take one poll and judge the run as of it."""
        if self.start is None:
            self.start = poll.at
            lines = self.history_lines
            self._banner_known = lines is None or poll.state.capture.count("\n") + 1 < lines
        self._now = poll.at
        self._latest = poll
        self._throughput.new.clear()
        self._loss.new.clear()
        self._new_samples = []
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
                self._now, held = held_at, None
            self._on_line(text)
            self._now = poll.at
        if texts or not hold:
            self._previous = texts[-_tail_length(entries) :]
        if poll.samples:
            self._nonfinite = _nonfinite_fields(poll.samples[-1])
        self._take_queues()
        self.polls += 1
        return self.results(warmup_over=warmup_over)

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
        self._new_samples.append(sample)
        self._formats.add(sample.reading.format)
        step = sample.step
        if step is not None:
            if self._progress_key != "step":
                self._restart_progress("step")
            self._reported.add("step")
            self._on_step(step, sample)
        elif self._progress_key != "step" or "step" not in self._reported:
            counter = _counter(sample)
            if counter is not None:
                if counter[0] != self._progress_key:
                    self._restart_progress(counter[0])
                self._reported.add("step")
                self._on_step(counter[1], sample)
        if sample.reading.format != "dflash":  # a DFlash line always carries them
            fields = sample.fields
            self._reported.update(f"queues.{q}" for q in self.spec.queues if q in fields)
            if "throughput" in fields:
                self._reported.add("throughput")
        throughput = sample.throughput
        if throughput is not None and math.isfinite(throughput):
            self._throughput.add(throughput)
            self._unit = sample.throughput_unit
        loss = sample.loss
        if loss is not None:
            self._loss_latest = loss
            if math.isfinite(loss):
                self._loss.add(loss)
            else:
                self._loss_nonfinite = True
        self._recent.append(sample)

    def _take_queues(self) -> None:
        """Each queue's readings in this poll's newest status lines (or the last one known)."""
        recent = self._new_samples[-_QUEUE_READINGS:]
        for name, polls in self._queues.items():
            readings = [v for s in recent if (v := s.numbers(name)) is not None]
            if not readings:
                older = self._new_samples[: -_QUEUE_READINGS or None]
                latest = next((v for s in reversed(older) if (v := s.numbers(name))), None)
                latest = latest or self._queue_latest[name]
                readings = [latest] if latest is not None else []  # nothing new: it holds
            if readings:
                self._queue_latest[name] = readings[-1]
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
    def progress(self) -> str | None:
        """The run's progress as last seen (`step 120`, `epoch 1.89`); None before any."""
        return None if self._step is None else f"{self._progress_key} {_fmt(self._step)}"

    def _restart_progress(self, key: str) -> None:
        """Progress is now read from another quantity (the bar appeared above HF's dicts):
        its values are not comparable with the old one's, so its timeline starts afresh."""
        self._progress_key = key
        self._step = self._step_max = None
        self._gaps.clear()
        self._changes = 0

    def _on_step(self, step: float, sample: Sample) -> None:
        at, minute = self._now, sample.elapsed_min
        restart = self._open_restart()
        # Ranks printing in turn may lag a step behind each other: two steps back is a restart,
        # unless the counter restarts with each epoch.
        backwards = (
            self._step_max is not None and step < self._step_max - 1 and not self._new_epoch(sample)
        )
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
        if step != self._step:
            if self._step is not None:
                if at > self._step_first_at:
                    # Seen at a later poll than the previous step: one gap of the cadence.
                    self._gaps.append(at - self._step_first_at)
                self._changes += 1
                if self._changes == 1:
                    self._first_change_at = at
                self._last_change_at = at
            self._step, self._step_first_at, self._step_first_min = step, at, minute
        self._step_last_min = minute
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
            sign = _FatalSign(stripped, self._now, self._step)
            self._keep(sign)
            self._open.append(sign)
            if stripped.startswith(_TRACEBACK):
                self._traceback = sign

    def _keep(self, sign: _FatalSign) -> None:
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
            self._keep(_FatalSign(stripped, self._now, self._step, noise=True))
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

    def _open_restart(self) -> _Restart | None:
        last = self.restarts[-1] if self.restarts else None
        return last if last is not None and not last.closed else None

    def _restart(self, why: str) -> _Restart:
        restart = _Restart(self._now, why, before_probe=self.polls == 0)
        self.restarts.append(restart)
        for sign in self._open:
            sign.outcome, sign.restart = "ended", restart  # the process that printed it is gone
        self._open = []
        return restart

    def _forgiven(self) -> bool:
        """One restart, before the probe began (a resume at the start): a warning only."""
        return len(self.restarts) == 1 and self.restarts[0].before_probe

    # -- judging --------------------------------------------------------------------------

    def results(self, *, warmup_over: bool = True) -> list[CheckResult]:
        self._warmup_over = warmup_over
        latest = self._latest
        if latest is None:
            return [CheckResult("alive", Verdict.FAIL, "no poll taken", "at least one poll")]
        results = [
            _alive(latest.state),
            self._fatal_result(),
            self._restarts_result(),
            _samples(latest),
        ]
        results.extend(self._queue_result(name, size) for name, size in self.spec.queues.items())
        results.append(self._throughput_result())
        results.append(self._step_result())
        results.append(self._loss_result())
        results.append(self._finite_result())
        gpus = self._gpus_result()
        if gpus is not None:
            results.append(gpus)
        return results

    def _gpus_result(self) -> CheckResult | None:
        """The run holds its GPUs and they are busy while it prints (launcher.verify.gpus)."""
        sample = self._latest.state.gpus if self._latest is not None else None
        if sample is None or sample.want <= 0:
            return None
        found = judge_gpus(sample, self.spec.gpus, printing=bool(self._new_samples))
        if found.ok:
            return CheckResult("gpus", Verdict.PASS, found.observed, found.expected)
        if found.warn:
            return CheckResult("gpus", Verdict.WARN, found.observed, found.expected)
        failure = Failure.DEFINITE if found.ok is False else Failure.PENDING
        return CheckResult("gpus", Verdict.FAIL, found.observed, found.expected, failure)

    def _fatal_result(self) -> CheckResult:
        patterns = self.spec.fail_patterns
        expected = (
            "none of: " + ", ".join(patterns) if patterns else "no fail patterns configured"
        ) + "; or the run goes on after it"
        forgiven = self._forgiven()
        failing = [
            s
            for s in self.fatal
            if not s.noise and (s.outcome == "open" or (s.outcome == "ended" and not forgiven))
        ]
        if failing:
            sign = failing[-1]
            observed = sign.describe()
            if sign.outcome == "ended":
                observed += " (then the run restarted)"
                return CheckResult("fatal", Verdict.FAIL, observed, expected, Failure.DEFINITE)
            return CheckResult("fatal", Verdict.FAIL, observed, expected, self._open_kind(sign))
        if self.fatal:
            sign = self.fatal[-1]
            if sign.outcome == "ended":
                observed = f"{sign.describe()} (then the run restarted, before the probe)"
                return CheckResult("fatal", Verdict.WARN, observed, expected)
            if sign.noise:
                observed = f"finaliser noise, harmless: {sign.describe()}"
            else:
                before = "?" if sign.step_before is None else sign.step_before
                observed = f"{sign.describe()} (the run went on: step {before} → {sign.step_after})"
            return CheckResult("fatal", Verdict.WARN, observed, expected)
        return CheckResult("fatal", Verdict.PASS, "no fail pattern", expected)

    def _open_kind(self, sign: _FatalSign) -> Failure:
        """A fatal sign nothing has followed yet: definite once the run had time to go on."""
        if self._latest is not None and (
            self._latest.state.pane_dead or not self._latest.state.session_exists
        ):
            return Failure.DEFINITE
        if sign.step_before is None and not self._warmup_over:
            return Failure.PENDING  # printed while starting up: the warmup is its grace
        cadence = self._cadence()
        if cadence is not None and self._now - sign.at < 2 * cadence:
            return Failure.PENDING  # the trainer prints slowly: give it two of its own lines
        return Failure.DEFINITE

    def _cadence(self) -> float | None:
        """Seconds between the step's changes, on average (None until it changed twice)."""
        if self._changes < 2:
            return None
        return (self._last_change_at - self._first_change_at) / (self._changes - 1)

    def _restarts_result(self) -> CheckResult:
        expected = "no restart during the probe (one before it is forgiven)"
        if not self.restarts:
            return CheckResult("restarts", Verdict.PASS, "none", expected)
        start = self.start or 0.0
        count = len(self.restarts)
        times = "once" if count == 1 else f"{count} times"
        shown = ", ".join(r.describe(start) for r in self.restarts[:3])
        observed = f"restarted {times} ({shown}{', …' if count > 3 else ''})"
        if self._forgiven():
            return CheckResult("restarts", Verdict.WARN, observed, expected)
        return CheckResult("restarts", Verdict.FAIL, observed, expected, Failure.DEFINITE)

    def _queue_result(self, name: str, size: int) -> CheckResult:
        check = f"queues.{name}"
        polls = self._queues[name]
        expected = (
            f"{size} {'entry' if size == 1 else 'entries'}, "
            f"each > 0 at least once in {self.spec.failure_threshold} polls"
        )
        latest = self._queue_latest[name]
        if latest is None:
            skipped = self._not_reported(check)
            if skipped is not None:
                return skipped
            return CheckResult(
                check, Verdict.FAIL, f"{name} never reported", expected, Failure.PENDING
            )
        shown = f"{name}=[{', '.join(_fmt(v) for v in latest)}]"
        if len(latest) != size:
            observed = f"{shown} ({len(latest)} entries)"
            return CheckResult(check, Verdict.FAIL, observed, expected, Failure.DEFINITE)
        readings = [r for poll in polls for r in poll if len(r) == size]
        empty = [i for i in range(size) if not any(r[i] > 0 for r in readings)]
        if empty:
            which = ", ".join(str(i + 1) for i in empty)
            which = f"bucket {which}" if len(empty) == 1 else f"buckets {which}"
            span = f" in {len(polls)} polls" if len(polls) > 1 else ""
            if len(readings) > 1 and not span:
                span = f" in {len(readings)} readings"
            observed = f"{shown} ({which} empty{span})"
            # Judged over failure_threshold polls already: waiting longer adds nothing.
            full = len(polls) >= self.spec.failure_threshold
            kind = Failure.IMMEDIATE if full else Failure.DEFINITE
            return CheckResult(check, Verdict.FAIL, observed, expected, kind)
        if any(not v > 0 for v in latest):
            return CheckResult(
                check, Verdict.PASS, f"{shown} (bursty: every bucket filled recently)", expected
            )
        return CheckResult(check, Verdict.PASS, shown, expected)

    def _throughput_result(self) -> CheckResult:
        spec = self.spec.throughput
        series = self._throughput
        unit = self._unit
        expected = f">= {_rate(spec.min, unit)}" + (
            f", reaching {_rate(spec.target, unit)} or rising" if spec.target is not None else ""
        )
        if spec.drop is not None:
            expected += f", not below {spec.drop:.0%} of this run's peak"
        current = series.current()
        if current is None:
            skipped = self._not_reported("throughput")
            if skipped is not None:
                return skipped
            return CheckResult(
                "throughput", Verdict.FAIL, "no throughput reported", expected, Failure.PENDING
            )
        values = list(series.values)
        trend = " -> ".join(_rate(v, unit) for v in _sketch(values))
        peak = series.smooth_max
        sagged = spec.drop is not None and peak is not None and current < spec.drop * peak
        if current < spec.min:
            observed = f"{trend} (below minimum"
            if sagged and peak is not None and peak >= spec.min:
                observed += f"; {current / peak:.0%} of this run's peak {_rate(peak, unit)}"
            if _rising(values, _FLOOR_RISE) and not sagged:
                observed += ", rising)"
                return CheckResult("throughput", Verdict.FAIL, observed, expected, Failure.PENDING)
            return CheckResult(
                "throughput", Verdict.FAIL, observed + ")", expected, Failure.DEFINITE
            )
        if sagged and peak is not None:
            share = current / peak * 100
            observed = (
                f"throughput {_spaced_rate(current, unit)}, {share:.0f} % of this run's "
                f"peak {_spaced_rate(peak, unit)}"
            )
            return CheckResult("throughput", Verdict.FAIL, observed, expected, Failure.DEFINITE)
        if spec.target is not None and current >= spec.target:
            return CheckResult("throughput", Verdict.PASS, f"{trend} (at target)", expected)
        if _rising(values, spec.rise_margin):
            return CheckResult("throughput", Verdict.PASS, f"{trend} (rising)", expected)
        if len(values) == 1:
            return CheckResult("throughput", Verdict.WARN, f"{trend} (one reading)", expected)
        if spec.target is not None:
            observed = f"{trend} (steady, below target {_rate(spec.target, unit)})"
            return CheckResult("throughput", Verdict.WARN, observed, expected)
        return CheckResult("throughput", Verdict.PASS, f"{trend} (steady)", expected)

    def progress_window(self) -> float | None:
        """Seconds within which the step must have changed for a poll to pass: a small
        multiple of the run's usual gap between changes (the median of the last ones seen at
        different polls: one long checkpoint save moves nothing), never less than one poll
        interval. Before any gap is known, that multiple of the interval. None without polls
        at a known interval (a single poll is judged by `stall_after` alone)."""
        if self.interval is None:
            return None
        typical = median(self._gaps) if self._gaps else self.interval
        return max(CADENCE_MULTIPLE * typical, self.interval)

    def _step_result(self) -> CheckResult:
        spec = self.spec.step
        key = self._progress_key
        expected = f"{key} advancing (changes within {_fmt(spec.stall_after)} s)"
        if spec.hang_after is not None:
            expected += f"; not silent for {_fmt(spec.hang_after)} s"
        window = self.progress_window()
        if window is not None:
            expected += f"; a passing poll: changed within {_fmt(round(window, 1))} s"
        if self._step is None:
            return CheckResult("step", Verdict.FAIL, "no step reported", expected, Failure.PENDING)
        shown = f"{key} {_fmt(self._step)}"
        unchanged = self._now - self._step_first_at
        # The `[Nm]` stamps also bound it: [3m] after [0m] means at least 2 minutes apart.
        start, end = self._step_first_min, self._step_last_min
        if start is not None and end is not None:
            unchanged = max(unchanged, (end - start - 1) * 60)
        if unchanged >= spec.stall_after:
            observed = f"{shown} unchanged for {unchanged:.0f} s"
            return CheckResult("step", Verdict.FAIL, observed, expected, Failure.IMMEDIATE)
        quiet = self._latest.state.quiet_for if self._latest is not None else None
        if spec.hang_after is not None and quiet is not None:
            hung = min(unchanged, quiet)
            if hung >= spec.hang_after:
                observed = (
                    f"{shown} unchanged, nothing printed and no checkpoint written "
                    f"for {_fmt(round(float(hung), 1))} s (hang_after {_fmt(spec.hang_after)} s)"
                )
                return CheckResult("step", Verdict.FAIL, observed, expected, Failure.IMMEDIATE)
        if window is not None and unchanged > window:
            # Not progressing now, not stalled yet: stall_after / hang_after decide.
            usual = median(self._gaps) if self._gaps else None
            pace = f"its usual gap {_fmt(round(usual, 1))} s" if usual else "no cadence yet"
            observed = f"{shown} unchanged for {unchanged:.0f} s ({pace})"
            return CheckResult("step", Verdict.FAIL, observed, expected, Failure.PENDING)
        return CheckResult(
            "step", Verdict.PASS, f"{shown}, last changed {unchanged:.0f} s ago", expected
        )

    def _not_reported(self, name: str) -> CheckResult | None:
        """SKIP for a quantity no status line of the run has carried, when its format may
        leave it out and the playbook did not ask for it; None when it must be judged."""
        if not self._formats or "dflash" in self._formats or name in self._reported:
            return None  # nothing read yet, or a format whose every line carries it
        spec = self.spec
        if name == "throughput":
            asked = bool({"min", "target"} & spec.throughput.model_fields_set)
        else:
            asked = "queues" in spec.model_fields_set
        if asked:
            return None
        what = name.split(".")[-1]
        return CheckResult(
            name,
            Verdict.SKIP,
            f"{what} not reported (the run's status lines carry none)",
            f"judged when the status lines carry {what}, or when the playbook asks for it",
        )

    def _loss_result(self) -> CheckResult:
        spec = self.spec.loss
        expected = f"finite, at most {1 + spec.warn_rise:g}x the lowest seen"
        if spec.max_rise is not None:
            expected += f" (failing above {1 + spec.max_rise:g}x)"
        if spec.ceiling is not None:
            expected += f", not back near the ceiling {spec.ceiling:g}"
        latest = self._loss_latest
        if latest is None:
            return CheckResult("loss", Verdict.PASS, "not reported yet", expected)
        if not math.isfinite(latest):
            return CheckResult("loss", Verdict.FAIL, f"loss={latest}", expected, Failure.DEFINITE)
        series = self._loss
        current = series.current()
        lowest = min(series.values)
        low = series.smooth_min  # one lucky reading does not make the lowest
        if current is not None and spec.ceiling is not None:
            ceiling = self._ceiling(current, low, spec.ceiling, expected)
            if ceiling is not None:
                return ceiling
        if current is not None and low is not None and spec.max_rise is not None:
            limit = low + abs(low) * spec.max_rise
            if current > limit:
                rise = (current - low) / abs(low)
                observed = f"loss {current:.4g}, up {rise:.0%} from this run's lowest {low:.4g}"
                return CheckResult("loss", Verdict.FAIL, observed, expected, Failure.DEFINITE)
        zeros = _trailing_zeros(series.values)
        if zeros >= _ZERO_LOSS_READINGS:
            before = next((v for v in reversed(series.values) if v != 0.0), None)
            was = f" (it was {before:.4g})" if before is not None else ""
            observed = (
                f"loss exactly 0 in the last {zeros} readings{was}: a NaN the trainer's filter "
                "logs as 0.0, or a loss that is not computed"
            )
            return CheckResult("loss", Verdict.FAIL, observed, expected, Failure.DEFINITE)
        if self._loss_nonfinite:
            observed = f"loss={latest:.4g}, but it was non-finite earlier"
            return CheckResult("loss", Verdict.WARN, observed, expected)
        if latest > lowest + abs(lowest) * spec.warn_rise:
            observed = f"loss={latest:.4g}, lowest {lowest:.4g}"
            return CheckResult("loss", Verdict.WARN, observed, expected)
        return CheckResult(
            "loss", Verdict.PASS, f"loss={latest:.4g} (lowest {lowest:.4g})", expected
        )

    @staticmethod
    def _ceiling(
        current: float, low: float | None, ceiling: float, expected: str
    ) -> CheckResult | None:
        """Near the loss of a model that predicts nothing: failing if it had been lower."""
        if current < _CEILING_NEAR * ceiling:
            return None
        if low is not None and low < _CEILING_NEAR * ceiling:
            observed = f"loss {current:.4g} near the ceiling {ceiling:g} (it was {low:.4g})"
            return CheckResult("loss", Verdict.FAIL, observed, expected, Failure.DEFINITE)
        observed = f"loss {current:.4g} still near the ceiling {ceiling:g} (not learning yet)"
        return CheckResult("loss", Verdict.FAIL, observed, expected, Failure.PENDING)

    def _finite_result(self) -> CheckResult:
        expected = "every other number in the latest status line finite"
        if not self._nonfinite:
            return CheckResult("finite", Verdict.PASS, "all finite", expected)
        shown = " ".join(f"{k}={v}" for k, v in self._nonfinite.items())
        loss = self._loss_latest
        if loss is not None and math.isfinite(loss):
            shown += f" (while loss={loss:.4g} looks plausible)"
        return CheckResult("finite", Verdict.FAIL, shown, expected, Failure.DEFINITE)


def _trailing_zeros(values: deque[float]) -> int:
    """How many of the latest readings are exactly 0."""
    count = 0
    for value in reversed(values):
        if value != 0.0:
            break
        count += 1
    return count


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


# --- one-poll helpers -----------------------------------------------------------------------


def fatal_signs(state: PaneState, spec: ChecksSpec) -> list[CheckResult]:
    """`alive` and `fatal` on one poll: enough to fail fast during warmup."""
    from launcher.verify.parse import parse_pane

    samples = tuple(parse_pane(state.capture, width=state.pane_width))
    by_name = {r.name: r for r in Judge(spec).add(Poll(0.0, state, samples))}
    return [by_name["alive"], by_name["fatal"]]


def evaluate(polls: Sequence[Poll], spec: ChecksSpec) -> list[CheckResult]:
    """All checks on the history so far (latest poll last), the warmup taken as over."""
    judge = Judge(spec)
    results = judge.results()
    for poll in polls:
        results = judge.add(poll)
    return results


def _alive(state: PaneState) -> CheckResult:
    expected = "session running, pane alive"
    if not state.session_exists:
        return CheckResult(
            "alive", Verdict.FAIL, "tmux session not found", expected, Failure.IMMEDIATE
        )
    if not state.pane_dead:
        return CheckResult("alive", Verdict.PASS, "session running", expected)
    status = state.dead_status if state.dead_status is not None else state.exit_code
    if status == 0 and not state.stopped:
        # Exit 0 is terminal success (the run finished), not a crash: see verify.lifecycle.
        return CheckResult("alive", Verdict.PASS, "run finished (exit status 0)", expected)
    tail = [line for line in clean_text(state.capture).splitlines() if line.strip()][-5:]
    observed = "pane dead" + (f", exit status {status}" if status is not None else "")
    if tail:
        observed += "\n" + "\n".join(tail)  # the first line stays a one-line summary
    return CheckResult("alive", Verdict.FAIL, observed, expected, Failure.IMMEDIATE)


def _samples(latest: Poll) -> CheckResult:
    count = len(latest.samples)
    expected = "at least 1 status line in the latest capture"
    if count:
        return CheckResult("samples", Verdict.PASS, f"{count} status lines", expected)
    lines = sum(1 for line in latest.state.capture.splitlines() if line.strip())
    observed = f"no status line in {lines} captured lines"
    return CheckResult("samples", Verdict.FAIL, observed, expected, Failure.PENDING)


def _fmt(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    return str(int(value)) if value.is_integer() else f"{value:g}"


def _rate(value: float, unit: str = "tok/s") -> str:
    if unit != "tok/s":
        return f"{value:.3g}{unit}"
    return f"{value / 1000:.1f}Ktok/s" if value >= 1000 else f"{value:.0f}tok/s"


def _spaced_rate(value: float, unit: str = "tok/s") -> str:
    if unit != "tok/s":
        return f"{value:.3g} {unit}"
    return f"{value / 1000:.1f} Ktok/s" if value >= 1000 else f"{value:.0f} tok/s"


def _rising(series: Sequence[float], margin: float) -> bool:
    """The later half's median beats the earlier half's by `margin` (medians: noise-proof)."""
    half = len(series) // 2
    if half == 0:
        return False
    earlier, later = median(series[:half]), median(series[-half:])
    return later > earlier * (1 + margin) and later > earlier


def _sketch(series: Sequence[float]) -> list[float]:
    # First, middle and last readings are enough to show a trend in one line.
    if len(series) <= 3:
        return list(series)
    return [series[0], series[len(series) // 2], series[-1]]
