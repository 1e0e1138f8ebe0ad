"""The `gpus` check: a run must hold the GPUs it was given and keep them busy while it prints."""

from __future__ import annotations

from launcher.verify.checks import Judge
from launcher.verify.gpus import GpuCheckSpec, GpuSample, judge, sample_from_answer, status_text
from launcher.verify.pane import PaneState, Poll
from launcher.verify.parse import parse_pane
from launcher.verify.results import Failure, Verdict
from launcher.verify.spec import ChecksSpec

LINE = (
    "[0m] step={step} loss=2.1000 acc=0.800 streak=3.0 lr=6.00e-04 noise=0.1000 | tgt=4.00b/s "
    "dft=1.00b/s (27.0Ktok/s) | q_pre=[8, 7, 6, 6, 5, 4] q_hs=[4] | epoch~0.00 ETA=1.0d"
)
ALL = tuple(range(8))


def busy(util: int, held: tuple[int, ...] = ALL, want: int = 8) -> GpuSample:
    return GpuSample(want, held, {i: util for i in range(8)}, {i: 22512 for i in range(8)})


def test_judge_each_way_a_run_can_leave_its_gpus_unused() -> None:
    spec = GpuCheckSpec()
    assert judge(busy(97), spec, printing=True).ok is True
    none = judge(busy(97, held=()), spec, printing=True)
    assert none.ok is False and "holds no GPU" in none.observed
    one = judge(busy(97, held=(0,)), spec, printing=True)
    assert one.ok is False and "holds 1 of 8 GPUs (0)" in one.observed
    idle = judge(busy(0), spec, printing=True)
    assert idle.ok is False and "8 of the run's 8 GPUs below 10 % busy" in idle.observed
    # Before any status line (CUDA starting): not a verdict yet.
    assert judge(busy(97, held=()), spec, printing=False).ok is None
    # Quiet (a checkpoint being saved): idle GPUs are no failure.
    assert judge(busy(0), spec, printing=False).ok is True
    # The floor is the playbook's.
    assert judge(busy(5), GpuCheckSpec(min_util=1), printing=True).ok is True


def test_seven_idle_gpus_of_eight_fail_even_with_one_busy() -> None:
    sample = GpuSample(8, ALL, {0: 100, **{i: 0 for i in range(1, 8)}}, {})
    found = judge(sample, GpuCheckSpec(), printing=True)
    assert found.ok is False and "7 of the run's 8 GPUs" in found.observed


def test_unknown_utilization_is_a_warning_not_a_pass_or_fail() -> None:
    sample = GpuSample(8, ALL, {}, {}, error="nvidia-smi timed out after 3.0s")
    found = judge(sample, GpuCheckSpec(), printing=True)
    assert found.ok is None and found.warn and "timed out" in found.observed


def test_a_value_nvidia_smi_did_not_give_never_fails_the_check() -> None:
    """[N/A] (MIG, some boards), ERR!, a missing row: unknown, never read as 0 % busy."""
    spec = GpuCheckSpec()
    na = GpuSample(8, ALL, {i: None for i in range(8)}, {i: None for i in range(8)})
    found = judge(na, spec, printing=True)
    assert found.ok is None and found.warn and "utilization unknown for GPU 0-7" in found.observed
    missing_rows = GpuSample(8, ALL, {0: 97, 1: 97}, {})
    assert judge(missing_rows, spec, printing=True).ok is None
    # Known idle GPUs still fail, unknown ones are not counted against the run.
    mixed = GpuSample(8, ALL, {0: 0, 1: 0, **{i: None for i in range(2, 8)}}, {})
    failed = judge(mixed, spec, printing=True)
    assert failed.ok is False and "2 of the run's 8 GPUs below 10 %" in failed.observed
    assert "GPU 0 0 %, GPU 1 0 %" in failed.observed


def test_facts_from_an_earlier_query_say_their_age_and_watchers_are_named() -> None:
    answer = {
        "want": 2, "held": [0, 1], "devices": [[0, 97, 22512], [1, 95, 22512]],
        "error": None, "age": 21.4, "watchers": [[812, "nvtop", list(range(8))]],
    }  # fmt: skip
    sample = sample_from_answer(answer)
    assert sample is not None and sample.age == 21.4
    found = judge(sample, GpuCheckSpec(), printing=True)
    assert found.ok is True and "(GPU facts 21 s old)" in found.observed
    text = status_text(sample)
    assert text.endswith("· 21 s old · nvtop (pid 812) watches GPUs 0-7"), text
    # Idle on an earlier answer (a slow or hung nvidia-smi: the same one poll after poll, maybe
    # from before the status lines): a warning, never a failure.
    idle = GpuSample(2, (0, 1), {0: 0, 1: 0}, {}, age=21.4)
    found = judge(idle, GpuCheckSpec(), printing=True)
    assert found.ok is None and found.warn and "not judged on an earlier answer" in found.observed


def test_sample_from_answer_and_status_text() -> None:
    answer = {"want": 2, "held": [0, 1], "devices": [[0, 97, 22512], [1, None, 2048]]}
    sample = sample_from_answer(answer)
    assert sample == GpuSample(2, (0, 1), {0: 97, 1: None}, {0: 22512, 1: 2048})
    assert status_text(sample) == "GPUs 2/2 held · util % 97 ? · mem GiB 22.0 2.0"
    assert sample_from_answer(None) is None
    assert sample_from_answer({"held": [0]}) is None  # an older agent's answer: no judgement


def _poll(at: float, step: int, gpus: GpuSample | None) -> Poll:
    capture = "\n".join(LINE.format(step=s) for s in range(1, step + 1))
    state = PaneState(True, False, None, None, capture, gpus=gpus)
    return Poll(at, state, tuple(parse_pane(capture)))


def test_judge_reports_gpus_only_for_runs_given_gpus() -> None:
    judge_ = Judge(ChecksSpec())
    names = [r.name for r in judge_.add(_poll(0, 3, None))]
    assert "gpus" not in names
    results = {r.name: r for r in Judge(ChecksSpec()).add(_poll(0, 3, busy(0, held=())))}
    gpus = results["gpus"]
    assert gpus.verdict is Verdict.FAIL and gpus.kind is Failure.DEFINITE
    ok = {r.name: r for r in Judge(ChecksSpec()).add(_poll(0, 3, busy(97)))}["gpus"]
    assert ok.verdict is Verdict.PASS and "97 % busy on average" in ok.observed


def test_metrics_export_per_gpu_gauges() -> None:
    from launcher.watch.metrics import Metrics

    metrics = Metrics()
    labels = metrics.labels("t", "h", 200)
    metrics.set_gpus(labels, GpuSample(2, (0,), {0: 97, 1: 0}, {0: 22512, 1: 0}))
    value = metrics.registry.get_sample_value
    assert value("launcher_gpu_utilization_percent", {**labels, "gpu": "0"}) == 97
    assert value("launcher_gpu_memory_used_bytes", {**labels, "gpu": "0"}) == 22512 * 2**20
    assert value("launcher_gpu_held_by_run", {**labels, "gpu": "1"}) == 0
