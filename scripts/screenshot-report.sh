#!/usr/bin/env bash
# Run by hand (not in CI): take a screenshot of a real report page in headless Chromium, to
# look at it as a person would. Needs root and Debian's chromium (apt-get install chromium).
# The page is the `smoke --report` of a real failed run (the demo trainer crashing) from the
# end-to-end test of the report, on a throwaway sandbox:
#   scripts/screenshot-report.sh [OUT.png]      (default docs/verify-report.png)
#   scripts/screenshot-report.sh --page FILE.html [OUT.png]   (an existing report)
set -euo pipefail
cd "$(dirname "$0")/.."
page=""
if [ "${1:-}" = "--page" ]; then
  page=$(realpath "$2")
  shift 2
fi
out=$(realpath -m "${1:-docs/verify-report.png}")
command -v chromium >/dev/null || { echo "chromium not found: apt-get install chromium" >&2; exit 2; }
work=$(mktemp -d /tmp/launcher-screenshot.XXXXXX)
trap 'rm -rf "$work"' EXIT
if [ -z "$page" ]; then
  page=$work/smoke.html
  LAUNCHER_KEEP_REPORT=$page .venv/bin/python -m pytest -x -q -p no:cacheprovider \
    --basetemp="$work/pytest" tests/e2e/test_report.py::test_smoke_report_of_a_crash
fi
# No network, no profile of anyone's: a new user data dir that is removed afterwards.
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$work/profile" --screenshot="$out" --window-size=1200,1600 \
  "file://$page" 2>"$work/chromium.log" || { cat "$work/chromium.log" >&2; exit 1; }
echo "screenshot: $out"
