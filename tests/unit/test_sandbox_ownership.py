"""The sandbox's marker and what `down` removes (launcher/sandbox/ownership.py): files only."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.core.errors import UsageError
from launcher.sandbox import ownership


def _sandbox_files(state: Path, vmids: tuple[int, ...] = (200,)) -> None:
    """What `up` leaves in a state dir, in small."""
    for name in ("inventory.yaml", "sshd_config", "id_ed25519", "known_hosts", "bin/pct"):
        (state / name).parent.mkdir(parents=True, exist_ok=True)
        (state / name).write_text("x\n")
    (state / "playbooks").mkdir(exist_ok=True)
    (state / "playbooks" / "demo.yaml").write_text("name: demo\n")
    (state / "gpus" / "pools").mkdir(parents=True)
    for vmid in vmids:
        (state / "lxc" / str(vmid) / "rootfs" / "etc").mkdir(parents=True)


def test_a_new_directory_is_claimed_and_removed_whole(tmp_path: Path) -> None:
    state = tmp_path / "sb"
    marker = ownership.claim(state, [201, 200])
    assert marker.made_dir and marker.vmids == (200, 201)
    assert ownership.read(state) == marker
    _sandbox_files(state, (200, 201))
    assert ownership.remove_made(state, marker) == []
    assert not state.exists()


def test_an_empty_directory_is_claimed_and_kept(tmp_path: Path) -> None:
    marker = ownership.claim(tmp_path, [200])
    assert not marker.made_dir
    _sandbox_files(tmp_path)
    assert ownership.remove_made(tmp_path, marker) == []
    assert tmp_path.is_dir() and list(tmp_path.iterdir()) == []


def test_up_again_keeps_the_id_and_adds_containers(tmp_path: Path) -> None:
    first = ownership.claim(tmp_path / "sb", [200])
    again = ownership.claim(tmp_path / "sb", [202])
    assert again.id == first.id and again.vmids == (200, 202)


def test_a_directory_with_other_files_is_refused_untouched(tmp_path: Path) -> None:
    (tmp_path / "thesis.tex").write_text("years of work\n")
    with pytest.raises(UsageError, match=r"not a sandbox's state dir .*thesis\.tex"):
        ownership.claim(tmp_path, [200])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thesis.tex"]


def test_down_without_a_marker_is_refused(tmp_path: Path) -> None:
    _sandbox_files(tmp_path)
    with pytest.raises(UsageError, match=rf"refusing to remove {tmp_path}: it has no"):
        ownership.required(tmp_path)


def test_a_sandbox_from_before_markers_is_claimed_with_its_containers(tmp_path: Path) -> None:
    _sandbox_files(tmp_path, (200, 203))
    marker = ownership.claim(tmp_path, [201])
    assert marker.vmids == (200, 201, 203) and not marker.made_dir


def test_a_users_files_survive_and_are_named(tmp_path: Path) -> None:
    state = tmp_path / "sb"
    marker = ownership.claim(state, [200])
    _sandbox_files(state)
    (state / "notes.txt").write_text("mine\n")
    (state / "playbooks" / "mine.yaml").write_text("name: mine\n")
    (state / "lxc" / "900").mkdir()  # a container the sandbox did not make
    (state / "sshd.log").mkdir()  # a directory where the sandbox writes a file
    (state / "bin" / "pvesh").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_text("not followed\n")
    left = ownership.remove_made(state, marker)
    assert [p.relative_to(state).as_posix() for p in left] == [
        "lxc/900",
        "notes.txt",
        "playbooks/mine.yaml",
        "sshd.log",
    ]
    assert (state / "notes.txt").read_text() == "mine\n"
    assert (state / "playbooks" / "mine.yaml").is_file()
    assert not (state / "playbooks" / "demo.yaml").exists()
    assert not (state / "lxc" / "200").exists() and not (state / "gpus").exists()
    assert (tmp_path / "elsewhere").read_text() == "not followed\n"
    assert ownership.read(state) == marker  # still marked: a second down finds it again


def test_a_file_is_no_state_dir(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("mine\n")
    with pytest.raises(UsageError, match="is not a directory"):
        ownership.claim(tmp_path / "file", [200])
    with pytest.raises(UsageError, match=r"has no \.launcher-sandbox"):
        ownership.required(tmp_path / "file")
    assert (tmp_path / "file").read_text() == "mine\n"
