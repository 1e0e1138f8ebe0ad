"""`python -m launcher.schemas [--check]`: regenerate the shipped JSON Schemas, or compare."""

from __future__ import annotations

import sys

from launcher.schemas import DIRECTORY, commands, render


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for command in commands():
        path = DIRECTORY / f"{command}.schema.json"
        text = render(command)
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(path.name)
        if not check:
            path.write_text(text, encoding="utf-8")
    if check and stale:
        print(f"stale: {', '.join(stale)} (run: python -m launcher.schemas)", file=sys.stderr)
        return 1
    for name in stale:
        print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
