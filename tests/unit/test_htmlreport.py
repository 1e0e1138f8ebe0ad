"""The HTML report, the terminal sparkline and the JUnit failure text, on real probe results.

The probe runs on recorded panes with a fake clock (no waiting); the page is read back with
html.parser as a browser would tokenise it.
"""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from html.parser import HTMLParser

import pytest

from launcher import __version__
from launcher.probe.htmlreport import Run, render_html, step_rate, throughput_unit, timeline
from launcher.probe.report import SPARKS, sparkline, to_junit
from launcher.verify.pane import PaneState
from launcher.verify.prober import Prober, ProbeResult, ProbeSettings
from launcher.verify.samples import Reading, ReadSample, Sample
from launcher.verify.spec import ChecksSpec

HOSTILE = (
    "evil <script>alert(1)</script> </pre><img src=http://x.invalid/a.png> \x1b]0;pwned\x07&amp;"
)
CRASH = [
    "Traceback (most recent call last):",
    *[f'  File "/root/t/train.py", line {n}, in layer{n}\n    layer{n + 1}()' for n in range(12)],
    "RuntimeError: NCCL error: unhandled cuda error (demo crash)",
]


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def status_line(second: int, ktok: float) -> str:
    return (
        f"[0m] step={second} loss={6.0 - 0.01 * second:.4f} acc=0.1 streak=0.0 lr=6.00e-04 "
        f"noise=0.1 | tgt=1b/s dft=1b/s ({ktok:.1f}Ktok/s) | q_pre=[8, 6, 6, 5, 4, 4] "
        "q_hs=[4] | epoch~0.00 ETA=1d"
    )


def pane(clock: Clock, start: float, crash_at: float | None = None) -> Callable[[], PaneState]:
    """A trainer printing one status line a second (and a hostile line), maybe crashing."""

    def poll() -> PaneState:
        t = clock.now - start
        lines = ["Starting pipeline...", HOSTILE]
        lines += [status_line(i, min(28.0, 2.0 + 4.0 * i)) for i in range(int(t) + 1)]
        dead = crash_at is not None and t >= crash_at
        if dead:
            lines += "\n".join(CRASH).splitlines()
        return PaneState(True, dead, 1 if dead else None, None, "\n".join(lines))

    return poll


def probe(crash_at: float | None = None) -> ProbeResult:
    clock = Clock()
    settings = ProbeSettings(wait=6, interval=2, window=20, successes=3)
    spec = ChecksSpec(throughput={"min": 1000})  # type: ignore[arg-type]
    poll = pane(clock, clock.now, crash_at)
    return Prober(lambda _t: poll(), spec, settings, clock=clock, sleep=clock.sleep).run()


class Page(HTMLParser):
    """What a browser would build: tags with attributes, and the text inside <pre>/<td>."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.stack: list[str] = []
        self.pre = ""
        self.cells: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self.stack.append(tag)
        if tag == "td":
            self.cells.append("")

    def handle_endtag(self, tag: str) -> None:
        while self.stack and self.stack.pop() != tag:
            pass

    def handle_data(self, data: str) -> None:
        if "pre" in self.stack:
            self.pre += data
        if "td" in self.stack:
            self.cells[-1] += data

    def all(self, tag: str) -> list[dict[str, str | None]]:
        return [attrs for name, attrs in self.tags if name == tag]


def header_of(page: str) -> dict[str, str]:
    """The report's header rows (name -> value), as a browser shows them."""
    table = re.search(r'<table class="header">(.*?)</table>', page)
    assert table, "no header table"
    rows = re.findall(r"<tr><th>(.*?)</th><td>(.*?)</td></tr>", table.group(1))
    return {html.unescape(name): html.unescape(value) for name, value in rows}


def parse(page: str) -> Page:
    parser = Page()
    parser.feed(page)
    parser.close()
    return parser


def test_page_has_charts_checks_and_inert_last_lines() -> None:
    result = probe(crash_at=9)
    assert result.verdict == "unhealthy"
    page = parse(render_html([Run("prod", result, None, ["q_pre", "q_hs"])]))
    titles = [a.get("aria-label") for a in page.all("svg")]
    assert titles == [
        "throughput (Ktok/s)",
        "loss",
        "step rate (steps/s)",
        "queue q_pre depth",
        "queue q_hs depth",
    ]
    lines = page.all("polyline")
    assert len(lines) == 3 + 6 + 1  # one per queue entry
    assert all(len((a["points"] or "").split()) >= 3 for a in lines)
    assert len(page.all("line")) >= 5 and any(a.get("class") == "warmup" for a in page.all("line"))
    assert {"alive", "fatal", "throughput", "step"} <= set(page.cells)
    # The hostile line is text, exactly as printed minus the terminal escape: no element.
    assert "evil <script>alert(1)</script> </pre><img src=http://x.invalid/a.png> &amp;" in page.pre
    assert "RuntimeError: NCCL error" in page.pre
    assert not page.all("script") and not page.all("img") and not page.all("link")
    assert "\x1b" not in page.pre and "pwned" not in page.pre
    for _, attrs in page.tags:
        for name, value in attrs.items():
            if name in ("src", "href") or (value and "://" in value and name != "xmlns"):
                pytest.fail(f"a reference out of the page: {name}={value}")
    csp = [a for a in page.all("meta") if a.get("http-equiv") == "Content-Security-Policy"]
    assert csp and "default-src 'none'" in (csp[0]["content"] or "")


def test_throughput_chart_rises_and_the_warmup_line_sits_at_the_wait() -> None:
    result = probe()
    assert result.verdict == "healthy", result.reason
    page = parse(render_html([Run("prod", result, None, ["q_pre"])]))
    first = page.all("polyline")[0]["points"] or ""
    ys = [float(p.split(",")[1]) for p in first.split()]
    assert ys[-1] < ys[0]  # SVG y grows downwards: throughput went up
    warmup = next(a for a in page.all("line") if a.get("class") == "warmup")
    xs = [float(p.split(",")[0]) for p in first.split()]
    # x of the warmup (6 s) lies between the first point (before the probe) and the last
    assert xs[0] < float(warmup["x1"] or 0) < xs[-1]


def test_header_names_what_was_judged_and_the_failing_check_comes_first() -> None:
    result = probe(crash_at=9)
    result.run = "dflash:abc123"
    result.record = {"run": "dflash:abc123", "sha256": "f" * 64, "time": "2026-12-01T06:21:53Z"}
    run = Run("prod", result, None, ["q_pre"], host="pve", vmid=200)
    text = render_html([run], generated="2026-12-01 06:30:00 UTC")
    header = header_of(text)
    assert header == {
        "target": "prod",
        "host": "pve",
        "CT": "200",
        "run": "dflash:abc123",
        "script sha256": "f" * 64,
        "deployed": "2026-12-01T06:21:53Z",
        "launcher": __version__,
        "report written": "2026-12-01 06:30:00 UTC",
    }
    # the failing checks lead, with their evidence, before the charts and in the table
    assert text.index("Why it failed") < text.index("<svg")
    page = parse(text)
    checks = [c for c in page.cells if c in ("alive", "fatal", "samples", "throughput", "step")]
    assert checks[:2] == ["alive", "fatal"] or checks[0] in ("alive", "fatal"), checks
    # a record of another run is not shown as this run's
    result.record = {"run": "dflash:older", "sha256": "0" * 64}
    assert header_of(render_html([run]))["script sha256"] == "unknown (no deploy record)"


def test_the_header_names_the_code_s_git_commit_when_the_deploy_recorded_one() -> None:
    result = probe(crash_at=9)
    result.run = "dflash:abc123"
    source = {"commit": "a1b2c3d4e5f6a7b8", "branch": "main", "dirty": True, "changed_count": 2}
    result.record = {"run": "dflash:abc123", "sha256": "f" * 64, "source": source}
    header = header_of(render_html([Run("prod", result, None, [])]))
    assert header["source"] == "a1b2c3d4e5f6 (main) + 2 uncommitted files"
    assert list(header).index("source") == list(header).index("script sha256") + 1


def test_the_header_says_the_deploys_overrides_and_who_made_it() -> None:
    result = probe(crash_at=9)
    result.run = "dflash:abc123"
    overrides = {"env": ["WANDB_API_KEY"], "set": ["env.HF_TOKEN=<redacted>"], "command": None}
    result.record = {"run": "dflash:abc123", "sha256": "f" * 64, "overrides": overrides,
                     "user": "ann", "client_host": "laptop"}  # fmt: skip
    header = header_of(render_html([Run("prod", result, None, [])]))
    assert header["overrides"] == "--env WANDB_API_KEY --set env.HF_TOKEN=<redacted>"
    assert header["deployed by"] == "ann from laptop"


def test_a_crash_during_the_warmup_fills_the_chart() -> None:
    result = probe(crash_at=3)
    assert result.verdict == "unhealthy"
    assert result.settings is not None and result.settings.wait == 6
    text = render_html([Run("prod", result, None, [])])
    page = parse(text)
    points = (page.all("polyline")[0]["points"] or "").split()
    last_x = float(points[-1].split(",")[0])
    # the data reaches the right edge (560 - 16): the 6 s warmup did not stretch the axis
    assert last_x > 500, points
    assert not any(a.get("class") == "warmup" for a in page.all("line"))
    assert "warmup ends at 6s" in text


def test_timeline_spreads_new_lines_over_the_poll_interval() -> None:
    result = probe()
    placed = timeline(result)
    times = [x for x, _ in placed]
    assert times == sorted(times)
    steps = [s.step for _, s in placed]
    assert steps == list(range(len(steps)))  # each status line once
    after = [x for x in times if x > 0]
    assert after and max(after) == pytest.approx(result.polls[-1].at - result.polls[0].at)
    # one line a second, measured between polls
    assert [round(rate) for _, rate in step_rate(result)] == [1] * (len(result.polls) - 1)


def test_unprobed_target_still_gets_a_section() -> None:
    page = parse(
        render_html([Run("staging", None, {"ok": False, "error": "<b>refused</b>"}, [], "x")])
    )
    assert not page.all("b") and not page.all("svg")
    assert any(a.get("class") == "deploy" for a in page.all("p"))


def test_sparkline_is_scaled_from_zero() -> None:
    plateau = [28_000 * (1 + 0.02 * ((-1) ** i)) for i in range(30)]
    assert set(sparkline(plateau)) == {SPARKS[-1]}
    ramp = sparkline([0, 7_000, 14_000, 21_000, 28_000])
    assert ramp[0] == SPARKS[0] and ramp[-1] == SPARKS[-1] and len(set(ramp)) == 5
    assert sparkline([1.0, float("nan")]) == SPARKS[-1] + "?"
    assert sparkline([]) == ""


def test_junit_failure_keeps_the_whole_traceback() -> None:
    result = probe(crash_at=9)
    root = ET.fromstring(to_junit([("prod", result, None)]))
    failures = root.findall(".//failure")
    assert failures
    for failure in failures:
        message = failure.get("message") or ""
        assert "\n" not in message and message.startswith("observed ")
        body = failure.text or ""
        tail = body.split("last lines:\n", 1)[1]
        assert tail.startswith("Traceback (most recent call last):")  # 26 lines, not the last 15
        assert tail.endswith("RuntimeError: NCCL error: unhandled cuda error (demo crash)")
        assert tail.count('  File "/root/t/train.py"') == 12
        assert "\x1b" not in body


def test_the_throughput_chart_keeps_the_trainer_s_own_unit() -> None:
    def line(unit: str, rate: float) -> tuple[float, Sample]:
        reading = Reading(format="kv", unit=unit)
        return (0.0, ReadSample(0, None, {"throughput": rate}, f"it {rate}", reading))

    assert throughput_unit([line("it/s", 1.1)]) == ("it/s", 1.0)  # not 0.0011 Ktok/s
    assert throughput_unit([line("samples/s", 80.0)]) == ("samples/s", 1.0)
    assert throughput_unit([line("tok/s", 50_000.0)]) == ("Ktok/s", 1000.0)
    assert throughput_unit([]) == ("Ktok/s", 1000.0)
