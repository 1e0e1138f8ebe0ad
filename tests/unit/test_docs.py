"""The docs against the code: every `launcher …` command line and every flag they show exists in
the CLI (the click tree itself, not a copy), every relative link resolves, the generated
references are current, and the README stays short enough to read in ten minutes."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from launcher.cli.main import cli
from launcher.entry import docsref
from launcher.sandbox import demo_trainer

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_BLOCKS = {"", "console", "sh", "shell", "bash"}
# Flags of other programs the docs show beside launcher's (each with where it belongs).
OTHER_FLAGS = {
    "--only": "./run bench",
    "--quick": "./run bench",
    "--runs": "./run bench",
    "--shim-dir": "./run demo",
    "--no-shim": "./run demo",
    "--stock-home": "./run bench",
    "--check": "python -m launcher.schemas / launcher.entry.docsref",
    "--write": "python -m launcher.entry.docsref",
    "--user": "systemctl --user",
    "--now": "systemctl enable --now",
    "--type": "pvesh get /cluster/resources --type vm",
    "--rdzv_id": "torchrun --rdzv_id",
    "--rdzv_endpoint": "torchrun --rdzv_endpoint",
    "--nnodes": "torchrun --nnodes",
    "--node_rank": "torchrun --node_rank",
    "--local_addr": "torchrun --local_addr",
    "--rdzv_conf": "torchrun --rdzv_conf",
    "--max_restarts": "torchrun --max_restarts",
    "--nproc_per_node": "torchrun --nproc_per_node",
    "--master_addr": "torchrun --master_addr",
    "--rdzv_backend": "torchrun --rdzv_backend",
    "--dist": "pytest -n 2 --dist loadfile",
    "--query-gpu": "nvidia-smi --query-gpu=…",
    "--query-compute-apps": "nvidia-smi --query-compute-apps=…",
    "--keep-env": "pct exec --keep-env",
    "--clear-env": "lxc-attach --clear-env",
    "--group": "pct push --group",
    "--no-kernel-module": "the NVIDIA driver installer, run in a container",
}
HELP = ("--help", "-h")  # click's own, on every command


def code_blocks(text: str) -> Iterator[tuple[str, list[str]]]:
    """(language, lines) of each fenced block."""
    language, lines, inside = "", [], False
    for line in text.splitlines():
        fence = re.match(r"^\s*```(\w*)", line)
        if fence and not inside:
            language, lines, inside = fence.group(1), [], True
        elif fence and inside:
            inside = False
            yield language, lines
        elif inside:
            lines.append(line)


def inline_spans(text: str) -> list[str]:
    outside = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.findall(r"`([^`\n]+)`", outside)


def joined_continuations(lines: list[str]) -> list[str]:
    """Shell lines with their backslash continuations joined, as the shell reads them."""
    joined: list[str] = []
    pending = ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    if pending:
        joined.append(pending)
    return joined


def command_lines(text: str) -> list[str]:
    """Every `launcher …` command line a page shows: in shell blocks and inline code."""
    found: list[str] = []
    for language, lines in code_blocks(text):
        if language not in SHELL_BLOCKS:
            continue
        for line in joined_continuations(lines):
            line = line.strip().removeprefix("$ ").removeprefix("sudo ")
            if line.startswith("launcher "):
                found.append(line)
            found.extend(re.findall(r"\$\((launcher [^)]*)\)", line))
    for span in inline_spans(text):
        span = span.removeprefix("sudo ")
        if span.startswith("launcher ") or span == "launcher":
            found.append(span)
        found.extend(re.findall(r"\$\((launcher [^)]*)\)", span))
    return found


def _option(command: click.Command, name: str) -> click.Option | None:
    for param in command.params:
        if isinstance(param, click.Option) and name in (*param.opts, *param.secondary_opts):
            return param
    return None


def problems_of(line: str) -> list[str]:
    """What in one command line the CLI does not have."""
    text = line.replace("\\|", "|")
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError as exc:
        return [f"{line!r}: {exc}"]
    for stop in ("|", ">", "&&", ";", "2>&1", "||"):
        if stop in tokens:
            tokens = tokens[: tokens.index(stop)]
    command: click.Command = cli
    problems: list[str] = []
    index = 1
    while index < len(tokens):
        token = tokens[index]
        if token in HELP:
            pass
        elif token.startswith("-") and token != "-":
            name = token.split("=", 1)[0]
            option = _option(command, name) or _option(cli, name)
            if option is None:
                problems.append(f"{line!r}: `{' '.join(command_path(command))}` has no {name}")
            elif not (option.is_flag or option.count) and "=" not in token:
                index += 1  # its value
        elif isinstance(command, click.Group):
            sub = command.get_command(click.Context(command), token)
            if sub is None:
                problems.append(f"{line!r}: no command {token!r}")
                return problems
            command = sub
        index += 1
    return problems


def command_path(command: click.Command) -> list[str]:
    return ["launcher"] if command is cli else [command.name or "?"]


def all_long_options() -> set[str]:
    options: set[str] = set()

    def walk(command: click.Command) -> None:
        for param in command.params:
            if isinstance(param, click.Option):
                options.update(o for o in (*param.opts, *param.secondary_opts) if o[:2] == "--")
        if isinstance(command, click.Group):
            for sub in command.commands.values():
                walk(sub)

    walk(cli)
    return options


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_documented_command_lines_exist_in_the_cli(page: Path) -> None:
    problems = [p for line in command_lines(page.read_text()) for p in problems_of(line)]
    assert not problems, "\n".join(problems)


def test_the_checker_catches_what_does_not_exist() -> None:
    assert problems_of("launcher deploy --restart -t prod --grace 5") == []
    assert problems_of('launcher -i "a b.yaml" verify --wait 180 --report x.html') == []
    assert problems_of("launcher logs -f -t prod \\| head") == []
    assert problems_of("launcher deploy --restrat")
    assert problems_of("launcher deplyo --restart")
    assert problems_of("launcher sandbox upp")
    found = command_lines(
        'x `launcher status -t a`\n```console\n$ eval "$(launcher sandbox env)"\n```'
    )
    assert found == ["launcher sandbox env", "launcher status -t a"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_documented_flags_exist(page: Path) -> None:
    """A `--flag` in inline code is launcher's unless the page says it belongs elsewhere."""
    known = all_long_options() | set(OTHER_FLAGS) | set(HELP)
    flags = {
        m
        for span in inline_spans(page.read_text())
        for m in re.findall(r"(?:^|\s)(--[a-z][a-z0-9_-]*)", span)
    }
    assert not flags - known, f"{page.name}: not options of launcher: {sorted(flags - known)}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if "://" in target or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
            continue
        if anchor and file.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", file.read_text(), flags=re.M)
            if anchor not in {_slug(h) for h in headings}:
                broken.append(target)
    assert not broken, f"{page.name}: broken links {broken}"


def test_generated_references_are_current() -> None:
    assert docsref.main(["--check"]) == 0, "run: python -m launcher.entry.docsref --write"


def test_readme_reads_in_ten_minutes() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


def test_sandbox_help_lists_every_demo_mode_and_the_state_dir() -> None:
    from click.testing import CliRunner

    result = CliRunner().invoke(cli, ["sandbox", "up", "--help"])
    assert result.exit_code == 0
    for mode in demo_trainer.MODES:
        assert mode in result.output, mode
    assert "LAUNCHER_SANDBOX_DIR" in result.output and "DEMO_MODE" in result.output
    sandbox_page = (ROOT / "docs" / "sandbox.md").read_text()
    for mode in demo_trainer.MODES:
        assert f"`{mode}`" in sandbox_page, mode


def test_sandbox_env_prints_the_inventory_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    state = tmp_path / "a state dir"
    monkeypatch.setenv("LAUNCHER_SANDBOX_DIR", str(state))
    result = CliRunner().invoke(cli, ["sandbox", "env"])
    assert result.exit_code == 0, result.output
    # stdout is what `eval` runs; what it does (this shell only) is said on stderr
    assert result.stdout == f"export LAUNCHER_INVENTORY='{state}/inventory.yaml'\n"
    assert "this shell's launcher commands now use" in result.stderr
    assert "unset LAUNCHER_INVENTORY" in result.stderr
    other = CliRunner().invoke(cli, ["sandbox", "env", "--state-dir", "/srv/sbx"])
    assert other.stdout == "export LAUNCHER_INVENTORY=/srv/sbx/inventory.yaml\n"
    assert not state.exists()  # nothing made
