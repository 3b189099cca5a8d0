#!/usr/bin/env bash
# Renders a study's report.html to a PNG with headless Chromium, for people to look at (not part of
# CI: the report's own tests check what can be checked without a browser).
#
#   apt-get install -y chromium      # Debian's package
#   tests/report/screenshot.sh data/results/quick/report.html /tmp/quick.png [width]
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 REPORT.html OUT.png [WIDTH]" >&2
  exit 2
fi
report=$(realpath "$1")
out=$(realpath -m "$2")
width=${3:-1300}
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [[ -z $browser ]]; then
  echo "$0: chromium not found (apt-get install chromium)" >&2
  exit 2
fi
# The page's height: a generous guess from its size (Chromium cannot size a screenshot to the page).
height=$(( $(grep -c '<tr>\|<figure>' "$report") * 40 + 2000 ))
"$browser" --headless --disable-gpu --no-sandbox --hide-scrollbars \
  --window-size="${width},${height}" --screenshot="$out" "file://$report" >/dev/null 2>&1
echo "$out (${width}x${height})"
