"""`launcher buckets plan`: the exact optimiser, the batching simulation, the CLI and playbook."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from launcher.buckets import require_numpy
from launcher.buckets.optimize import model_padded_tokens, optimal_groups, plan_buckets
from launcher.buckets.simulate import pack, simulate
from launcher.cli.main import cli, main
from launcher.config.models import load_playbook
from launcher.core.errors import LauncherError, UsageError

REPO = Path(__file__).resolve().parents[2]
BUDGET = 49_152
MAX_LEN = 8_192


def synthetic_lengths(n: int = 200_000, seed: int = 7) -> np.ndarray:
    """A long-tailed mix up to 8,192: most samples short, a thin tail of long ones."""
    rng = np.random.default_rng(seed)
    short = rng.lognormal(np.log(1000), 0.55, int(n * 0.8))
    medium = rng.lognormal(np.log(2600), 0.45, int(n * 0.17))
    long = rng.uniform(3000, MAX_LEN, n - len(short) - len(medium))
    lengths = np.concatenate([short, medium, long]).astype(np.int64)
    return rng.permutation(np.clip(lengths, 16, MAX_LEN))


@pytest.fixture(scope="module")
def lengths() -> np.ndarray:
    return np.sort(synthetic_lengths())


def grid_search(ordered: np.ndarray, buckets: int, candidates: np.ndarray) -> list[int]:
    """The team's way: coordinate descent of the inner boundaries over a grid of candidates."""

    values, counts = np.unique(ordered, return_counts=True)
    below = np.concatenate(([0], np.cumsum(counts)))  # samples shorter than values[i]

    def cost(inner: list[int]) -> int:
        # model_padded_tokens on the histogram: sum over buckets of N_k * (longest in bucket k)
        cuts = np.searchsorted(values, [*inner, MAX_LEN], side="right")
        starts = np.concatenate(([0], cuts[:-1]))
        filled = cuts > starts
        return int(((below[cuts] - below[starts]) * values[cuts - 1])[filled].sum())

    inner = sorted({int(c) for c in np.quantile(ordered, np.linspace(0, 1, buckets + 1)[1:-1])})
    inner = [int(candidates[np.abs(candidates - b).argmin()]) for b in inner]
    best = cost(inner)
    improved = True
    while improved:
        improved = False
        for index in range(len(inner)):
            low = inner[index - 1] if index else 0
            high = inner[index + 1] if index + 1 < len(inner) else MAX_LEN
            for candidate in candidates[(candidates > low) & (candidates < high)].tolist():
                trial = [*inner[:index], candidate, *inner[index + 1 :]]
                trial_cost = cost(trial)
                if trial_cost < best:
                    best, inner, improved = trial_cost, trial, True
    return [0, *inner, MAX_LEN]


def test_optimum_beats_a_290_candidate_grid_search_in_the_model_and_in_simulation(
    lengths: np.ndarray,
) -> None:
    candidates = np.unique(np.linspace(64, MAX_LEN - 32, 290).round().astype(np.int64))
    assert len(candidates) == 290
    grid = grid_search(lengths, 6, candidates)
    plan = plan_buckets(lengths, buckets=6, budget=BUDGET, top=MAX_LEN)
    assert len(plan.boundaries) == 7 and plan.boundaries[0] == 0 and plan.boundaries[-1] == MAX_LEN

    real = int(lengths.sum())
    grid_model = real / model_padded_tokens(lengths, grid)
    assert grid_model > 0.7  # a sensible plan, not a degenerate one
    assert plan.padded_tokens == model_padded_tokens(lengths, plan.boundaries)
    assert plan.model_efficiency >= grid_model

    # The simulation is not the optimised objective, so there it is "no worse" up to sampling
    # noise: 0.1 percentage points, several times the spread between two epochs' shuffles.
    ours = simulate(lengths, plan.boundaries, BUDGET, epochs=3, seed=0)
    theirs = simulate(lengths, grid, BUDGET, epochs=3, seed=0)
    noise = 1e-3
    spread = max(ours.bucketed.epoch_efficiencies) - min(ours.bucketed.epoch_efficiencies)
    assert spread < noise
    assert ours.bucketed.efficiency >= theirs.bucketed.efficiency - noise
    # The model pads to the bucket's longest sample, greedy packing only to the batch's own.
    assert ours.bucketed.efficiency >= plan.model_efficiency


def test_simulated_efficiency_orders_sorted_bucketed_random(lengths: np.ndarray) -> None:
    plan = plan_buckets(lengths, buckets=6, budget=BUDGET, top=MAX_LEN)
    result = simulate(lengths, plan.boundaries, BUDGET, epochs=2, seed=3)
    assert result.sorted.efficiency > result.bucketed.efficiency > result.random.efficiency
    assert 0.99 < result.sorted.efficiency <= 1.0
    assert len(result.bucketed.epoch_efficiencies) == 2
    for size, longest in zip(result.bucket_sizes, plan.longest, strict=True):
        assert BUDGET // longest <= size.smallest <= size.largest  # never fewer than the model


def brute_force(values: list[int], counts: list[int], groups: int) -> int:
    best = None
    for inner in itertools.combinations(range(1, len(values)), groups - 1):
        ends = [*inner, len(values)]
        starts = [0, *inner]
        cost = sum(sum(counts[i:j]) * values[j - 1] for i, j in zip(starts, ends, strict=True))
        best = cost if best is None else min(best, cost)
    assert best is not None
    return best


def test_dynamic_programme_matches_brute_force_on_small_cases() -> None:
    rng = np.random.default_rng(11)
    for _ in range(150):
        d = int(rng.integers(1, 10))
        values = sorted(rng.choice(np.arange(1, 500), d, replace=False).tolist())
        counts = rng.integers(1, 50, d).tolist()
        for groups in range(1, d + 1):
            cost, ends = optimal_groups(values, counts, groups)
            assert cost == brute_force(values, counts, groups)
            assert len(ends) == groups and ends[-1] == d and ends == sorted(set(ends))


def test_plan_on_small_samples_is_optimal_over_all_boundary_choices() -> None:
    rng = np.random.default_rng(5)
    for _ in range(40):
        ordered = np.sort(rng.integers(1, 60, int(rng.integers(3, 40))))
        distinct = np.unique(ordered).tolist()
        for buckets in range(1, min(4, len(distinct)) + 1):
            plan = plan_buckets(ordered, buckets=buckets, budget=100, top=60)
            best = min(
                model_padded_tokens(ordered, [0, *inner, 60])
                for inner in itertools.combinations(distinct[:-1], buckets - 1)
            )
            assert plan.padded_tokens == best
            assert sum(plan.samples) == len(ordered)


def test_greedy_packing_respects_the_budget_and_closes_batches_only_when_full() -> None:
    rng = np.random.default_rng(2)
    for _ in range(100):
        budget = int(rng.integers(20, 400))
        sequence = rng.integers(1, budget + 1, int(rng.integers(1, 200))).tolist()
        padded, sizes = pack(sequence, budget)
        assert sum(sizes) == len(sequence)
        total, start = 0, 0
        for size in sizes:
            batch = sequence[start : start + size]
            assert size * max(batch) <= budget
            if start + size < len(sequence):  # the next sample would not have fitted
                assert (size + 1) * max(*batch, sequence[start + size]) > budget
            total += size * max(batch)
            start += size
        assert padded == total


def run(args: list[str]) -> tuple[int, str]:
    """Invoke the CLI like `main` does: a LauncherError becomes its exit code and message."""
    result = CliRunner().invoke(cli, args, prog_name="launcher")
    error = result.exception
    if isinstance(error, LauncherError):
        hint = f"\nhint: {error.hint}" if error.hint else ""
        return int(error.exit_code), f"{result.output}error: {error.message}{hint}"
    if error is not None and not isinstance(error, SystemExit):
        raise error
    return result.exit_code, result.output


@pytest.fixture
def lengths_file(tmp_path: Path) -> Path:
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(map(str, synthetic_lengths(20_000, seed=1).tolist())) + "\n")
    return path


def plan_args(path: Path, *extra: str) -> list[str]:
    return ["buckets", "plan", str(path), "--budget", str(BUDGET), *extra]


@pytest.mark.parametrize(
    ("content", "extra", "message"),
    [
        ("", [], "no lengths in the file (it is empty)"),
        ("12\n-3\n40\n", [], "lengths.txt:2: negative length -3"),
        ("12\n\n0\n", [], "lengths.txt:3: zero length 0"),
        ("12\n4.5\n", [], "lengths.txt:2: not an integer length: '4.5'"),
        ("12\nabc\n", [], "not an integer length: 'abc'"),
        ("12\n40\n", ["--buckets", "0"], "--buckets must be at least 1 (got 0)"),
        ("12\n60000\n", [], "--budget 49152 is smaller than the longest sample (60000)"),
        ("12\n9000\n", ["--max-len", "8192"], "1 length(s) exceed --max-len 8192"),
        ("12\n40\n", ["--buckets", "3"], "only 2 distinct length(s)"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(
    tmp_path: Path, content: str, extra: list[str], message: str
) -> None:
    path = tmp_path / "lengths.txt"
    path.write_text(content)
    code, output = run(plan_args(path, *extra))
    assert code == 2, output
    assert message in output


def test_bad_input_through_main_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "lengths.txt"
    path.write_text("100\n200\n")
    with pytest.raises(SystemExit) as exit_info:
        main(plan_args(path, "--budget", "150"))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error: --budget 150 is smaller than the longest sample (200)" in err
    assert "hint: use --budget 200 or more" in err


def test_npy_and_json_lines_inputs(tmp_path: Path) -> None:
    values = synthetic_lengths(5_000, seed=3)
    npy = tmp_path / "lengths.npy"
    np.save(npy, values)
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text(
        "".join(json.dumps({"id": i, "n": int(v)}) + "\n" for i, v in enumerate(values))
    )
    text = tmp_path / "lengths.txt"
    text.write_text("\n".join(map(str, values.tolist())))
    reports = []
    for path, extra in ((npy, []), (jsonl, ["--field", "n"]), (text, [])):
        code, output = run(plan_args(path, "--json", *extra))
        assert code == 0, output
        reports.append(json.loads(output))
    assert reports[0]["boundaries"] == reports[1]["boundaries"] == reports[2]["boundaries"]

    np.save(npy, values.astype(np.float64) + 0.5)
    code, output = run(plan_args(npy))
    assert code == 2 and "lengths.npy[0]: not an integer length" in output
    code, output = run(plan_args(jsonl))
    assert code == 2 and "need --field NAME" in output
    code, output = run(plan_args(jsonl, "--field", "length"))
    assert code == 2 and "data.jsonl:1: no field 'length'" in output


def test_json_shape(lengths_file: Path) -> None:
    code, output = run(
        plan_args(lengths_file, "--max-len", "8192", "--sorted-throughput", "32", "--json")
    )
    assert code == 0, output
    report = json.loads(output)
    assert report["schema"] == "launcher.buckets/1"
    assert report["budget"] == BUDGET and report["buckets"] == 6 and report["max_len"] == MAX_LEN
    boundaries = report["boundaries"]
    assert len(boundaries) == 7 and boundaries[0] == 0 and boundaries[-1] == MAX_LEN
    assert boundaries == sorted(set(boundaries))
    assert report["input"]["samples"] == 20_000
    assert set(report["batching"]) == {"sorted", "bucketed", "random"}
    for batching in report["batching"].values():
        assert set(batching) == {
            "label",
            "efficiency",
            "epoch_efficiencies",
            "batches_per_epoch",
            "throughput_ktok_s",
        }
        assert len(batching["epoch_efficiencies"]) == 3
    assert report["batching"]["sorted"]["throughput_ktok_s"] == 32.0
    effs = [report["batching"][name]["efficiency"] for name in ("sorted", "bucketed", "random")]
    assert effs == sorted(effs, reverse=True)
    stats = report["bucket_stats"]
    assert [s["upper"] for s in stats] == boundaries[1:]
    assert sum(s["samples"] for s in stats) == 20_000
    assert all(s["batch_size_min"] >= s["batch_size_model"] for s in stats)
    assert 0 < report["model"]["efficiency"] <= report["batching"]["bucketed"]["efficiency"]
    assert set(report["timings"]) == {"load", "optimize", "simulate", "total", "cpu"}
    assert report["playbook"] is None


def test_text_table(lengths_file: Path) -> None:
    code, output = run(plan_args(lengths_file, "--buckets", "4", "--sorted-throughput", "32"))
    assert code == 0, output
    assert "boundaries  [0, " in output
    assert "length-sorted, fixed batches" in output and "~32.0 Ktok/s" in output
    assert "bucketed shuffle, 4 buckets" in output and "full random shuffle" in output


def test_write_playbook_records_boundaries_and_q_pre(tmp_path: Path, lengths_file: Path) -> None:
    (tmp_path / "playbooks").mkdir()
    playbook = tmp_path / "playbooks" / "dflash.yaml"
    shutil.copy(REPO / "playbooks" / "dflash.yaml", playbook)
    trainer = tmp_path / "launcher" / "sandbox" / "demo_trainer.py"  # its script.source
    trainer.parent.mkdir(parents=True)
    trainer.write_text("print('demo')\n")
    before = yaml.safe_load(playbook.read_text())

    code, output = run(
        plan_args(lengths_file, "--buckets", "5", "--write-playbook", str(playbook), "--json")
    )
    assert code == 0, output
    report = json.loads(output)
    spec = load_playbook(playbook).spec
    assert spec.buckets == report["boundaries"] and len(spec.buckets) == 6
    assert spec.verify.queues == {"q_pre": 5, "q_hs": 1}
    assert report["playbook"]["mode"] == "edited" and report["playbook"]["q_pre_before"] == 6

    text = playbook.read_text()
    assert text.startswith("# playbooks/dflash.yaml")  # comments kept
    assert "# The sandbox's demo trainer stands in" in text
    after = yaml.safe_load(text)
    assert after.pop("buckets") == report["boundaries"]
    assert after["verify"].pop("queues") == {"q_pre": 5, "q_hs": 1}
    before["verify"].pop("queues")
    assert after == before

    # Planning again replaces the recorded boundaries rather than adding a second key.
    code, output = run(plan_args(lengths_file, "--buckets", "3", "--write-playbook", str(playbook)))
    assert code == 0, output
    assert "verify.queues.q_pre 5 → 3" in output
    spec = load_playbook(playbook).spec
    assert spec.verify.queues["q_pre"] == 3 and spec.buckets is not None and len(spec.buckets) == 4
    assert playbook.read_text().count("buckets:") == 1


def test_write_playbook_refuses_an_invalid_playbook(tmp_path: Path, lengths_file: Path) -> None:
    playbook = tmp_path / "broken.yaml"
    playbook.write_text("name: x\nsession: x\n")
    code, output = run(plan_args(lengths_file, "--write-playbook", str(playbook)))
    assert code == 2 and "required key is missing" in output
    assert playbook.read_text() == "name: x\nsession: x\n"


def test_missing_numpy_is_a_usage_error_with_the_pip_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "numpy", None)
    with pytest.raises(UsageError) as error:
        require_numpy()
    assert (
        error.value.hint is not None
        and "pip install 'proxmox-launcher[buckets]'" in error.value.hint
    )


def test_help_does_not_import_numpy() -> None:
    code = (
        "import sys; from launcher.cli.main import cli; "
        "assert 'numpy' not in sys.modules, 'numpy imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
