"""Which checkpoint archives a deploy may prune (launcher/agent/archives.py, choose_prunes)."""

from __future__ import annotations

import calendar
import os
from typing import Any

from launcher.agent.archives import archives_of, choose_prunes, run_seconds
from launcher.agent.paths import exit_path

DAY = 86400.0


def archive(name: str, seconds: float, checkpoints: int) -> dict[str, Any]:
    return {"path": name, "seconds": seconds, "checkpoints": checkpoints, "bytes": 1}


# newest first: the one this deploy made, then older ones
QUICK = [archive(f"quick{i}", 40.0, 0) for i in range(4)]
WEEK_LONG = archive("week", 7 * DAY, 168)


def test_unset_keeps_every_archive() -> None:
    assert choose_prunes([*QUICK, WEEK_LONG], None, force=False) == ([], [])


def test_a_week_long_run_outlives_four_typo_fixes() -> None:
    prune, spared = choose_prunes([*QUICK, WEEK_LONG], 3, force=False)
    assert [a["path"] for a in prune] == ["quick3"]
    assert [a["path"] for a in spared] == ["week"]
    assert "lived longer (7.0 d) than the runs since (at most 40 s)" in spared[0]["reason"]
    assert "holds more checkpoints (168) than theirs (at most 0)" in spared[0]["reason"]


def test_prune_archives_is_the_users_word() -> None:
    prune, spared = choose_prunes([*QUICK, WEEK_LONG], 3, force=True)
    assert [a["path"] for a in prune] == ["quick3", "week"] and spared == []


def test_more_checkpoints_alone_keeps_it() -> None:
    older = archive("older", 30.0, 9)
    prune, spared = choose_prunes([archive("new", 60.0, 2), older], 1, force=False)
    assert prune == [] and spared[0]["reason"] == (
        "its run holds more checkpoints (9) than theirs (at most 2)"
    )


def test_an_archive_the_runs_since_match_is_pruned() -> None:
    kept = [archive("a", 2 * DAY, 40), archive("b", 1 * DAY, 10)]
    old = archive("old", 1 * DAY, 40)
    assert choose_prunes([*kept, old], 2, force=False) == ([old], [])


def test_keep_zero_never_prunes_the_archive_just_made() -> None:
    made = archive("made", 10.0, 1)
    prune, _ = choose_prunes([made, archive("old", 5.0, 1)], 0, force=True)
    assert [a["path"] for a in prune] == ["old"]


def test_only_names_a_deploy_gives_are_archives(tmp_path: Any) -> None:
    for name in (
        "ckpt.archived-20260101T000000Z",
        "ckpt.archived-20260101T000000Z-2",
        "ckpt.archived-20260101T000000Z-10",
        "ckpt.archived-20250101T000000Z",
        "ckpt.archived-my-backup",  # the user's own copy
        "ckpt.archived-20260101T000000Z.tar",
    ):
        (tmp_path / name).mkdir()
    assert [p.rsplit("/", 1)[1] for p in archives_of(str(tmp_path / "ckpt"))] == [
        "ckpt.archived-20260101T000000Z-10",
        "ckpt.archived-20260101T000000Z-2",
        "ckpt.archived-20260101T000000Z",
        "ckpt.archived-20250101T000000Z",
    ]


def test_a_runs_length_is_from_its_run_id_to_its_exit_file(tmp_path: Any) -> None:
    start = calendar.timegm((2026, 1, 1, 0, 0, 0, 0, 0, 0))
    exit_file = exit_path(str(tmp_path), "s")
    os.makedirs(os.path.dirname(exit_file))
    with open(exit_file, "w") as handle:
        handle.write("1\n")
    os.utime(exit_file, (start + 5400, start + 5400))  # it crashed 1.5 h in
    assert run_seconds(str(tmp_path), "s", "s:20260101T000000Z-0123abcd") == 5400.0
    assert run_seconds(str(tmp_path), "s", "s:not-a-run-id") is None
