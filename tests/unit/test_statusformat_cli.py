"""`launcher status-format detect|test` on samples from a file or standard input (the pane
through -t is the e2e tests' part: tests/e2e/test_formats.py)."""

from __future__ import annotations

from pathlib import Path

import yaml
from click.testing import CliRunner

from launcher.cli.main import main
from tests.unit.projectfiles import write_project

PANES = Path(__file__).resolve().parent.parent / "fixtures" / "panes"
PIPES = "".join(
    f"step {317 + i} | loss 2.0{i} | tok/s 5067{i} | q_pre {12 + i}/16 | q_post 3/16\n"
    for i in range(4)
)


def run(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    """The command as `main` runs it (its errors become exit codes there)."""
    runner = CliRunner()
    with runner.isolation(input=stdin) as (out, err, _):
        try:
            main(["status-format", *args])
            code = 0
        except SystemExit as exit_info:
            code = int(exit_info.code or 0)
        return code, out.getvalue().decode(), err.getvalue().decode()


def test_detect_prints_the_block_on_stdout_and_why_on_stderr(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("Loading model\n" + PIPES)
    code, out, err = run("detect", str(log))
    assert code == 0
    assert yaml.safe_load(out) == {
        "status": {
            "format": "keyvalue",
            "fields": {"throughput": "tok/s", "throughput_unit": "tok/s"},
        }
    }
    assert "4 of 5 lines read as keyvalue lines: step, loss, throughput; confidence 1.00" in err
    assert "#   | step 320 | loss 2.03" in err


def test_detect_reads_standard_input_and_a_preset() -> None:
    code, out, _ = run("detect", "-", stdin=(PANES / "megatron_250col_wrapped.txt").read_text())
    assert (code, out) == (0, "status:\n  preset: megatron\n")


def test_detect_keeps_a_redrawn_bar_one_line() -> None:
    # A log of a tqdm run holds each bar's redraws after `\r` on one line: not one line each.
    bar = "Epoch {e}: {p:3d}%|#   | {n}/100 [00:0{e}<00:01, 37.56it/s, v_num=0, train_loss={l}]"
    text = "".join(
        "\r".join(bar.format(e=e, p=n, n=n, l=2.5 - n / 100) for n in range(10, 60, 10)) + "\n"
        for e in range(3)
    )
    code, out, _ = run("detect", "-", stdin=text)
    assert code == 0
    assert yaml.safe_load(out)["status"] == {
        "format": "keyvalue",
        "progress": "Epoch",
        "fields": {"loss": "train_loss"},
    }


def test_detect_without_status_lines_exits_1_quoting_them() -> None:
    code, out, err = run("detect", "-", stdin="Loading shards\nbuilding the index\n")
    assert (code, out) == (1, "")
    assert "no status: block found: none of the 2 lines reads as a status line" in err
    assert "  | building the index" in err


def test_test_shows_what_each_line_reads_to(tmp_path: Path) -> None:
    write_project(tmp_path)
    book = tmp_path / "playbooks" / "dflash.yaml"
    # DFlash's reader (the default) reads none of them: nothing but `-` lines, exit 1.
    code, out, err = run("test", str(book), stdin="Loading\n" + PIPES)
    assert code == 1
    assert out.count("-  not a status line") == 5
    assert "none of the 5 lines reads as a status line with this block" in err
    with book.open("a") as handle:
        handle.write("status: {format: keyvalue, fields: {throughput: tok/s}}\n")
    code, out, err = run("test", str(book), stdin="Loading\n" + PIPES)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "    1  Loading" and lines[1] == "       -  not a status line"
    assert lines[3] == "       →  step=317  loss=2  throughput=50670 tok/s  q_pre=75% full"
    assert err == (
        "4 of 5 lines read as status lines: step in 4, loss in 4, throughput in 4, q_pre in 4; "
        "never read: q_hs\n"
    )


def test_test_with_an_invalid_playbook_exits_2(tmp_path: Path) -> None:
    write_project(tmp_path)
    book = tmp_path / "playbooks" / "dflash.yaml"
    with book.open("a") as handle:
        handle.write("status: {format: csv}\n")
    code, _, err = run("test", str(book), stdin=PIPES)
    assert code == 2 and "status.format" in err


def test_test_shows_every_field_as_read_when_asked(tmp_path: Path) -> None:
    write_project(tmp_path)
    book = tmp_path / "playbooks" / "dflash.yaml"
    with book.open("a") as handle:
        handle.write("status: {preset: nanogpt}\n")
    # nanoGPT train.py: f"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu ..."
    sample = "iter 100: loss 2.1000, time 30.50ms, mfu 12.30%\n"
    code, out, _ = run("test", str(book), "--all-fields", stdin=sample)
    assert code == 0
    assert out.splitlines()[1:] == [
        "       →  step=100  loss=2.1  throughput=32.7869 it/s",
        "          fields: iter=100  loss=2.1  time=0.0305 s  mfu=12.3 %  step=100  "
        "throughput=32.7869",
    ]
