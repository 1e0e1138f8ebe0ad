"""`launcher status-format detect|test`: find the playbook `status:` block that reads a trainer's
lines, and show what each line reads to with a playbook's block (the loop a person runs until
it reads right). Local but for `detect -t TARGET`, which reads the target's live pane.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from launcher.cli.context import AppContext, global_options, pass_app, single_target_option

if TYPE_CHECKING:
    from launcher.verify.samples import Sample

PANE_LINES = 400  # the pane's last lines `detect -t` reads
MAX_SAMPLE_BYTES = 64 << 20  # a log larger than this is read from its end


@click.group("status-format")
def status_format() -> None:
    """Find and test how the trainer's status lines are read (the playbook's `status:`).

    \b
    Example:
      launcher status-format detect train.log         # a status: block that reads it
      python train.py 2>&1 | head -50 | launcher status-format detect -
      launcher status-format detect -t prod           # the target's live pane
      launcher status-format test playbooks/train.yaml < train.log
    """


@status_format.command("detect")
@click.argument("source", required=False, metavar="[FILE|-]")
@single_target_option
@global_options
@pass_app
def detect_command(app: AppContext, source: str | None) -> None:
    """Print a playbook `status:` block that reads the trainer's lines.

    The lines come from FILE (a log), from standard input (`-`, or no FILE and no -t) or,
    with -t (or LAUNCHER_TARGET when nothing is piped in), from the target's tmux pane.
    The block goes to stdout (paste it into the playbook); what was found, and how sure,
    to stderr.

    \b
    Example:
      launcher status-format detect train.log
      python train.py 2>&1 | head -50 | launcher status-format detect -
      launcher status-format detect -t prod
    Exit codes: 0 a block was found, 1 none reads the lines, 2 usage, 3 unreachable (-t).
    """
    from launcher.verify.detect import detect_status

    # -t reads the pane; LAUNCHER_TARGET only when nothing is piped in (it is often set
    # for the shell, and a piped log is what the person meant).
    pane = source is None and (bool(app.target_names) or (sys.stdin.isatty() and bool(app.names())))
    lines = _pane_lines(app) if pane else _read_lines(source or "-")
    found = detect_status(lines)
    if found.status is None:
        click.echo(f"no status: block found: {found.explanation}", err=True)
        for line in found.examples:
            click.echo(f"  | {_safe(line)}", err=True)
        sys.exit(1)
    click.echo(found.yaml(), nl=False)
    click.echo(f"# {found.explanation}; confidence {found.confidence:.2f}", err=True)
    for line in found.examples:
        click.echo(f"#   | {_safe(line)}", err=True)
    if found.confidence < 1:
        click.echo("# check it: launcher status-format test PLAYBOOK < sample.log", err=True)


@status_format.command("test")
@click.argument("playbook", type=click.Path(path_type=Path, dir_okay=False))
@click.argument("source", required=False, default="-", metavar="[FILE|-]")
@click.option(
    "--all-fields", "-a", is_flag=True, help="Also show every field each line holds, as read."
)
def test_command(playbook: Path, source: str, all_fields: bool) -> None:
    """Show, line by line, what the playbook's `status:` block reads a sample to.

    The sample is FILE or standard input. Each line is shown with the quantities the
    checks read (step, loss, throughput in its unit, the playbook's queues, watched fields),
    or `-` when it is not a status line; a summary ends it. --all-fields adds every field
    each line holds, as read.

    \b
    Example:
      launcher status-format test playbooks/train.yaml < train.log
      launcher logs --raw -t prod | launcher status-format test playbooks/train.yaml
    Exit codes: 0 status lines with a step (or the counter standing for it) were read,
    1 none were, 2 the playbook is invalid.
    """
    from launcher.config.models import load_playbook
    from launcher.verify.lines import logical_lines
    from launcher.verify.parse import parse_pane

    spec = load_playbook(playbook).spec
    lines = [line for line in logical_lines("\n".join(_read_lines(source))) if line.strip()]
    # Joined already: a width no row reaches joins none and cuts none.
    samples = parse_pane("\n".join(lines), spec.status, width=1 << 30)
    queues = list(spec.verify.queues)
    at = 0
    read: dict[str, int] = {}
    for number, line in enumerate(lines, 1):
        click.echo(f"{number:5}  {_safe(line)}")
        sample = samples[at] if at < len(samples) else None
        if sample is None or sample.raw != line.strip():
            click.echo("       -  not a status line")
            continue
        at += 1
        shown = _fields(sample, queues)
        for name, _ in shown:
            read[name] = read.get(name, 0) + 1
        click.echo("       →  " + "  ".join(f"{name}={value}" for name, value in shown))
        if all_fields:
            every = "  ".join(f"{key}={_value(sample.fields.get(key))}" for key in sample.fields)
            click.echo(f"          fields: {_safe(every)}")
    click.echo(_summary(len(lines), len(samples), read, queues), err=True)
    stepped = read.get("step", 0) or read.get("epoch", 0)
    sys.exit(0 if stepped else 1)


def _fields(sample: Sample, queues: list[str]) -> list[tuple[str, str]]:
    """The quantities the checks read from one status line, as text."""
    shown: list[tuple[str, str]] = []
    if sample.step is not None:
        shown.append(("step", str(sample.step)))
    elif (epoch := sample.number("epoch")) is not None:
        shown.append(("epoch", f"{epoch:g}"))
    if (loss := sample.loss) is not None:
        shown.append(("loss", f"{loss:g}"))
    if (rate := sample.throughput) is not None:
        shown.append(("throughput", f"{rate:g} {sample.throughput_unit}"))
    for name in queues:
        queue = sample.queue(name)
        if queue is None:
            continue
        kind, values = queue
        if kind == "fill":
            shown.append((name, f"{values[0]:.0%} full"))
        elif kind == "buckets":
            shown.append((name, "[" + ", ".join(f"{v:g}" for v in values) + "]"))
        else:
            shown.append((name, f"{values[0]:g}"))
    for name, value in sample.watched().items():
        shown.append((name, "?" if value is None else f"{value:g}"))
    if sample.elapsed_min is not None:
        shown.append(("elapsed", f"{sample.elapsed_min:g} min"))
    if (eta := sample.eta_seconds) is not None:
        shown.append(("eta", f"{eta:g} s"))
    return shown or [("(nothing the checks read)", "")]


def _value(value: object) -> str:
    """A field's value as read: a number, a duration, `n/total`, a list, `?` (not known)."""
    from launcher.verify.samples import Quantity, Share

    if value is None:
        return "?"
    if isinstance(value, Quantity):
        return f"{value.value:g} {value.unit}"
    if isinstance(value, Share):
        return f"{value.value:g}/{value.total:g}"
    if isinstance(value, tuple):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    if isinstance(value, float | int) and not isinstance(value, bool):
        return f"{value:g}"
    return repr(value)


def _summary(lines: int, samples: int, read: dict[str, int], queues: list[str]) -> str:
    if not samples:
        return (
            f"none of the {lines} lines reads as a status line with this block "
            "(launcher status-format detect suggests one)"
        )
    counts = ", ".join(f"{name} in {n}" for name, n in read.items() if name)
    missing = [q for q in ("step", "loss", "throughput", *queues) if q not in read]
    if "epoch" in read and "step" in missing:
        missing.remove("step")
    text = f"{samples} of {lines} lines read as status lines: {counts}"
    if missing:
        text += f"; never read: {', '.join(missing)}"
    return text


def _read_lines(source: str) -> list[str]:
    """A sample's lines: split at newlines only, so a `\\r` redraw stays in its line (the
    parser resolves it as a terminal would)."""
    if source == "-":
        if sys.stdin.isatty():
            raise click.UsageError("give a log FILE, pipe one in (-), or -t TARGET for its pane")
        data = sys.stdin.buffer.read()
    else:
        path = Path(source)
        try:
            with path.open("rb") as handle:
                size = path.stat().st_size
                if size > MAX_SAMPLE_BYTES:
                    handle.seek(size - MAX_SAMPLE_BYTES)
                data = handle.read(MAX_SAMPLE_BYTES)
        except OSError as error:
            raise click.UsageError(f"cannot read {source}: {error.strerror}") from None
    return data.decode("utf-8", "replace").split("\n")


def _pane_lines(app: AppContext) -> list[str]:
    """The target's pane, as `launcher logs --raw` shows it."""
    from launcher.commands.table import run
    from launcher.core.requests import LogsRequest
    from launcher.operate.logs import LogsResult
    from launcher.targets.fleet import run_one

    lines: list[str] = []
    result: LogsResult = run_one(
        app.target(),
        lambda ctx: run(ctx, LogsRequest(tail=PANE_LINES, raw=True)),
        say=lambda _: None,
        output=lines.append,
    )
    if result.exit_code:
        from launcher.output.termsafe import sanitize

        click.echo(sanitize(result.summary, keep_sgr=False), err=True)
        sys.exit(int(result.exit_code))
    return lines


def _safe(line: str) -> str:
    from launcher.output.termsafe import sanitize

    return sanitize(line, keep_sgr=False)
