"""The agent's GPU facts, pure parts: nvidia-smi's values (unknown is never 0), minor numbers
tied to indexes, CUDA_VISIBLE_DEVICES resolved, nvidia-smi's failures named."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.agent import gpus
from launcher.agent.base import AgentError
from launcher.agent.nvsmi import describe_failure, host_driver_version

ROWS = (
    "0, GPU-aaaa-1, 00000000:C1:00.0, 22512, 97887, 97, NVIDIA H100 80GB HBM3\n"
    "1, GPU-bbbb-2, 00000000:E1:00.0, 3, 97887, 0, NVIDIA H100 80GB HBM3\n"
)


@pytest.mark.parametrize(
    "value", ["[N/A]", "[Not Supported]", "ERR!", "", "12abc", "-5", "1e3", "[Unknown Error]"]
)
def test_a_value_nvidia_smi_did_not_give_is_unknown_not_zero(value: str) -> None:
    (row,) = gpus.parse_devices(f"0, GPU-aaaa-1, 00000000:C1:00.0, {value}, 97887, {value}, X\n")
    assert row["used_mib"] is None and row["util"] is None


def test_rows_that_are_not_rows_are_left_out() -> None:
    out = ROWS + "garbage\n0, GPU-dup, 00000000:C2:00.0, 1, 1, 1, X\n2, GPU-c, 0000\n" + "x" * 500
    found = gpus.parse_devices(out)
    assert [(d["index"], d["bus"]) for d in found] == [(0, "0000:c1:00.0"), (1, "0000:e1:00.0")]
    assert gpus.number("101", 100) is None and gpus.number("100", 100) == 100


def test_minor_numbers_come_from_proc_or_nvidia_smi_q(tmp_path: Path) -> None:
    """A container given the host's GPUs 6 and 7 sees index 0 and 1: the minor is not the index."""
    for bus, minor in (("0000:c1:00.0", 6), ("0000:e1:00.0", 7)):
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "information").write_text(
            f"Model: \t\t NVIDIA H100\nBus Location: \t {bus}\nDevice Minor: \t {minor}\n"
        )
    assert gpus.proc_minors(str(tmp_path)) == {"0000:c1:00.0": 6, "0000:e1:00.0": 7}
    q = (
        "==============NVSMI LOG==============\n\nAttached GPUs : 2\n"
        "GPU 00000000:C1:00.0\n    Product Name : NVIDIA H100\n    Minor Number : 6\n"
        "GPU 00000000:E1:00.0\n    Minor Number : N/A\n"
    )
    assert gpus.details_minors(q) == {"0000:c1:00.0": 6}
    devices = gpus.with_minors(gpus.parse_devices(ROWS), {"0000:c1:00.0": 6, "0000:e1:00.0": 7})
    assert [(d["index"], d["minor"]) for d in devices] == [(0, 6), (1, 7)]
    assert gpus.index_of_minor(devices) == {6: 0, 7: 1}
    # Nothing known anywhere: the minor is taken for the index, as before.
    bare = gpus.with_minors(gpus.parse_devices(ROWS), {})
    assert [d["minor"] for d in bare] == [0, 1]


def test_users_hold_uvm_and_watchers_do_not(monkeypatch: pytest.MonkeyPatch) -> None:
    scan = {100: ({6, 7}, True), 200: ({6, 7}, False), 300: ({7}, True)}
    devices = gpus.with_minors(gpus.parse_devices(ROWS), {"0000:c1:00.0": 6, "0000:e1:00.0": 7})
    monkeypatch.setattr(gpus, "proc_name", lambda pid: "nvtop")
    users, watchers = gpus.gpu_holders(None, devices, scan)
    assert users == {100: [0, 1], 300: [1]} and watchers == {200: [0, 1]}
    assert gpus.gpu_holders([300], devices, scan) == ({300: [1]}, {})
    assert gpus.describe_watchers(watchers) == "nvtop (pid 200) watches GPUs 0, 1"
    assert gpus.describe_watchers({812: list(range(8))}) == "nvtop (pid 812) watches GPUs 0-7"


LISTING = (
    "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-aaaa-1)\n"
    "  MIG 1g.5gb      Device  0: (UUID: MIG-1111)\n"
    "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-bbbb-2)\n"
    "  MIG 1g.5gb      Device  0: (UUID: MIG-2222)\n"
)


@pytest.mark.parametrize(
    ("visible", "wanted"),
    [
        ("", {0, 1}),
        ("1", {1}),
        ("GPU-bbbb-2", {1}),
        ("GPU-bbbb", {1}),  # a unique prefix, as CUDA takes it
        ("GPU-aaaa-1,GPU-bbbb-2", {0, 1}),
        ("MIG-2222", {1}),
        ("MIG-GPU-aaaa-1/1/0", {0}),
        (" 0 , 1 ", {0, 1}),
    ],
)
def test_cuda_visible_devices_resolves_to_indexes(visible: str, wanted: set[int]) -> None:
    devices = gpus.parse_devices(ROWS)
    env = {"CUDA_VISIBLE_DEVICES": visible}
    assert gpus.wanted_gpus(2, env, devices, LISTING) == wanted


@pytest.mark.parametrize(
    ("visible", "why"),
    [
        ("5", "no GPU with index 5 here (2 visible)"),
        ("GPU-", "matches more than one GPU"),
        ("GPU-cccc", "matches no GPU"),
        ("MIG-9999", "no MIG device MIG-9999"),
        ("nvidia0", "neither an index"),
    ],
)
def test_cuda_visible_devices_that_name_no_gpu_here_are_refused(visible: str, why: str) -> None:
    with pytest.raises(AgentError) as caught:
        gpus.wanted_gpus(2, {"CUDA_VISIBLE_DEVICES": visible}, gpus.parse_devices(ROWS), LISTING)
    assert caught.value.kind == "invalid" and why in caught.value.message
    assert f"CUDA_VISIBLE_DEVICES={visible}" in caught.value.message


@pytest.mark.parametrize(
    ("rc", "out", "name", "says"),
    [
        (18, "Failed to initialize NVML: Driver/library version mismatch\n"
             "NVML library version: 580.159\n", "version mismatch",
         "NVML 580.159 in the container, kernel module 580.126.09 on the host"),
        (15, "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error\n",
         "GPU lost", "GPU at 0000:3B:00.0"),
        (9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
         "no driver", "pass /dev/nvidia*"),
        (17, "Failed to initialize NVML: Unknown Error", "blocked by cgroups",
         "lxc.cgroup2.devices.allow"),
        (255, "Failed to initialize NVML: Driver/library version mismatch", "version mismatch",
         "--no-kernel-module"),
    ],
)  # fmt: skip
def test_driver_faults_are_named_with_their_fix(
    tmp_path: Path, rc: int, out: str, name: str, says: str
) -> None:
    version = tmp_path / "version"
    version.write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.126.09  Release Build  "
        "(dvs-builder@U22)  Wed Jan  7 22:51:36 UTC 2026\nGCC version:  gcc version 13.3.0\n"
    )
    found, text = describe_failure(rc, out, "", str(version))
    assert found == name and says in text, text
    assert f"nvidia-smi exit {rc}" in text
    assert host_driver_version(str(tmp_path / "absent")) is None


def test_a_failure_that_is_no_known_fault_is_quoted() -> None:
    assert describe_failure(4, "Insufficient Permissions\n", "") == (
        None,
        "Insufficient Permissions",
    )
