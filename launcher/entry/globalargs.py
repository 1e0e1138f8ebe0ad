"""The group's global options (cli/main.py) read from argv before click is imported: what the
console script needs to answer `--version` at once without loading the CLI.

Standard library only. `tests/unit/test_globalargs.py` checks these names against the click
group's own options.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

# The group's options that take a value, and its flags (besides --version and --help).
WITH_VALUE = frozenset(("-i", "--inventory", "-t", "--target", "--known-hosts", "--identity"))
FLAGS = frozenset(("--debug", "-q", "--quiet"))
SHORT = {"-i": "--inventory", "-t": "--target"}


@dataclass
class Argv:
    """argv read as the group reads its global options, wherever they stand."""

    values: dict[str, list[str]] = field(default_factory=dict)  # long name -> values, in order
    rest: list[str] = field(default_factory=list)  # every other word, in order
    command: str | None = None  # the first word that is no option nor an option's value

    def last(self, option: str) -> str | None:
        """The last value given to `option` (its long name), or None."""
        given = self.values.get(option)
        return given[-1] if given else None


def read(argv: Sequence[str]) -> Argv:
    """Each global option with its value (`-i x`, `-ix`, `--inventory x`, `--inventory=x`;
    a value is the next word whatever it looks like, as click takes it), and the rest."""
    found = Argv()
    words = list(argv)
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            tail = words[i + 1 :]
            found.rest += tail
            if found.command is None and tail:
                found.command = tail[0]
            break
        name, value, width = _option(word, words[i + 1] if i + 1 < len(words) else None)
        if name is not None:
            if value is not None:
                found.values.setdefault(name, []).append(value)
            i += width
            continue
        if word in FLAGS:
            found.values.setdefault(word, []).append("")
        else:
            found.rest.append(word)
            if found.command is None and not word.startswith("-"):
                found.command = word
        i += 1
    return found


def _option(word: str, following: str | None) -> tuple[str | None, str | None, int]:
    """(long name, value, words used) when `word` is a global option that takes a value."""
    if word in WITH_VALUE:
        return SHORT.get(word, word), following, 2
    long, equals, value = word.partition("=")
    if equals and long in WITH_VALUE and long.startswith("--"):
        return long, value, 1
    if word[:2] in SHORT and len(word) > 2:
        return SHORT[word[:2]], word[2:], 1
    return None, None, 1
