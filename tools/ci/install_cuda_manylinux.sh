#!/usr/bin/env bash
# The CUDA toolkit (nvcc, cuBLAS headers) inside the manylinux_2_28 image (a RHEL 8
# family system), for the CUDA wheel job of .github/workflows/wheels.yml.
# $1: the toolkit's package version (13-0); CUDA_REPO_URL: NVIDIA's rhel8 repository file.
set -euo pipefail
version="${1:?toolkit version, e.g. 13-0}"
: "${CUDA_REPO_URL:?set CUDA_REPO_URL to NVIDIA's RHEL 8 x86_64 repository file}"
dnf install -y dnf-plugins-core
dnf config-manager --add-repo "$CUDA_REPO_URL"
dnf install -y "cuda-nvcc-${version}" "cuda-cudart-devel-${version}" "libcublas-devel-${version}"
ln -sfn "/usr/local/cuda-${version/-/.}" /usr/local/cuda
/usr/local/cuda/bin/nvcc --version
