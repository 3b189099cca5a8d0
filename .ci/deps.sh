#!/usr/bin/env bash
# Installs the Debian 12 packages attnlab needs (build, tests, CLI, plots, benchmarks; clang-format
# for the format check, LLVM's libomp for the tsan preset, Open MPI for data-parallel training,
# oneDNN for the float GEMMs with the OpenCL headers its CMake package asks for, SentencePiece for
# the BPE tokenizer).
# Idempotent: packages already present are skipped, so a ready machine pays nothing.
set -euo pipefail
packages=(
  cmake ninja-build g++ pkg-config
  libxtensor-dev libxtensor-blas-dev libxsimd-dev xtl-dev libopenblas-dev
  doctest-dev libcli11-dev nlohmann-json3-dev libbenchmark-dev gnuplot-nox
  clang-format libomp-14-dev
  libopenmpi-dev openmpi-bin
  libdnnl-dev ocl-icd-opencl-dev
  libsentencepiece-dev
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "attnlab: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
