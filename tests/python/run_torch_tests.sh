#!/bin/sh
# Runs tests/python/test_attnlab_torch.py (PyTorch interop) with the first Python that can import
# torch: $ATTNLAB_PYTHON, python3 on PATH, then Debian's /usr/bin/python3 (python3-torch). Exits 77,
# which CTest reports as skipped, when none can.
# Usage: run_torch_tests.sh ATTNLAB_CLI
for py in "${ATTNLAB_PYTHON:-}" python3 /usr/bin/python3; do
  [ -n "$py" ] || continue
  if "$py" -c "import torch" >/dev/null 2>&1; then
    exec "$py" "$(dirname "$0")/test_attnlab_torch.py" "$@"
  fi
done
echo "skipped: no Python here can import torch (Debian: apt-get install python3-torch)"
exit 77
