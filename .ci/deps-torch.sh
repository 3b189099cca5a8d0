#!/usr/bin/env bash
# CI only: Debian's PyTorch (python3-torch 1.13, CPU) for the PyTorch interop test
# (tests/python). Not part of the README's install: users who want python/attnlab_torch.py bring
# their own torch. pip's default torch (gigabytes of CUDA wheels) is kept out of CI on purpose, and
# no pip package is needed: the script reads and writes safetensors itself.
# A failed install does not fail CI: the interop test then reports itself as skipped, and this says
# so here.
set -uo pipefail
if /usr/bin/python3 -c "import torch" >/dev/null 2>&1; then exit 0; fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "attnlab: installing python3-torch (CI: the PyTorch interop test)"
if ! { $SUDO apt-get update -qq &&
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    python3-torch >/dev/null; }; then
  echo "attnlab: WARNING: python3-torch did not install; the PyTorch interop test will be skipped"
fi
exit 0
