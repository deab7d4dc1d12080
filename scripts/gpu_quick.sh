#!/usr/bin/env bash
# A short device check of this round's GPU paths (issue 32), for a lent GPU with little time left:
# the timelines on NCCL (device times), the executors on NCCL, and two gloo ranks sharing the GPU per
# family (DeAR and the parameter servers refused in one line). Writes $OUT/gpu_quick.txt.
set -u
out="${OUT:-/tmp}/gpu_quick.txt"
{
  echo "# gpu_quick $(date -u +%FT%TZ)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py \
    -k "timelines_on_nccl or executor_on_nccl" -rA 2>&1 | tail -25
  timeout 70 python3 -c "
from tests.gpu_targets import two_ranks_per_family
r = two_ranks_per_family('cuda', schedulers=('mgwfbp', 'dear_threshold', 'ps_bsp'), steps=3, budget_s=60)
for k, v in r.items():
    print(k, 'trains' if v['trains'] else ('refused: ' if v.get('refused') else 'FAILS: ') + str(v.get('error')))
" 2>&1 | tail -8
} > "$out" 2>&1
cat "$out"
