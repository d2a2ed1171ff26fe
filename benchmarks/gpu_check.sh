#!/usr/bin/env bash
# GPU check for a lent GPU machine (about 4 minutes): the CUDA tests
# (tests/defenses/federated/test_cuda.py: a DP-FedAvg run on cuda against the CPU run, the noise's std in
# the sum of uploads) and a quick benchmark on the device. Output goes to $OUT (default ./gpu-out).
#
#   OUT=/some/dir bash benchmarks/gpu_check.sh
#
# Needs python3 with torch (CUDA), numpy, scipy, scikit-learn, pyyaml, pytest, and the pure-Python
# packages dp-accounting, absl-py, attrs, mpmath, hypothesis, sortedcontainers (and dm-tree, which
# dp-accounting imports; it is a binary wheel) — put their wheels' folder on PYTHONPATH or
# `pip install --no-index --find-links WHEELS ...` first. The CNN workload reads MNIST with the
# project's loader, which needs torchvision (the lent machines' image has it).
# The CNN workload reads the MNIST t10k files from $DPFL_AUDIT_DATA/mnist when set, else
# the shared data folder beside the repository (which does not travel to a lent machine: copy it into the repository).
# Run on 2026-11-26 (one H200) with wheels of dp-accounting, dm-tree, jsonschema, jsonschema-specifications,
# referencing and rpds-py installed to a --target folder on PYTHONPATH: 13 tests passed.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu-out}"
mkdir -p "$OUT"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
{
  date
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
} > "$OUT/environment.txt" 2>&1
timeout 150 "$PY" -m pytest tests/defenses/federated/test_cuda.py tests/benchmarks/test_roofline.py -q -p no:cacheprovider \
  > "$OUT/pytest.txt" 2>&1
echo "pytest exit $?" >> "$OUT/pytest.txt"
timeout 200 "$PY" benchmarks/run_all.py --device cuda --quick --skip-flower --skip-memory --skip-sequential \
  --out "$OUT/run_all.json" > "$OUT/run_all.txt" 2> "$OUT/run_all.stderr"
echo "run_all exit $?" >> "$OUT/run_all.txt"
tail -3 "$OUT/pytest.txt"
cat "$OUT/run_all.txt"
