#!/usr/bin/env bash
# Issue 36's checks and figures in one call on a GPU machine (the device tool's `run`), from the
# repository root: the CUDA tests (the graph's capture and replays against eager, dropout, a failed
# capture, the fallback; the engine on CUDA), then bench/emulator/on_cuda.py for fc_mnist and BERT
# debug twice: first without the torch.compile column (eager, the emulator without and with the
# graph, the first steps' cost, 100 steps' numbers: the figures that must come back), then with it
# (torch.compile(mode="reduce-overhead") compiles for a minute or more per model). Each part has its
# own time limit, under 9 minutes in all, so that a hang loses one part, not the session.
# Everything is written under $OUT (default /tmp/gpu_session): tests.txt, junit.xml, on_cuda.md
# and on_cuda_compile.md. Needs torch with CUDA, pytest, pyyaml, h5py, numpy (the GPU image has
# them); csrun is read from this checkout. The README job on the GPU (bench/e2e/main_job.py --gpu)
# needs MPI and the venv as well, and is not run here.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/gpu_session}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))" 2>&1 | tee "$out/tests.txt"
timeout 180 python3 -m pytest -v -p no:cacheprovider -rs -o timeout=90 --junitxml="$out/junit.xml" \
    tests/emulator/test_cuda_graph.py tests/emulator/test_cuda.py 2>&1 | tee -a "$out/tests.txt"
timeout 120 python3 bench/emulator/on_cuda.py --steps 100 --rounds 3 --models fc_mnist,bert_debug --no-compile 2>&1 \
    | tee "$out/on_cuda.md"
timeout 220 python3 bench/emulator/on_cuda.py --steps 100 --rounds 3 --models fc_mnist,bert_debug 2>&1 \
    | tee "$out/on_cuda_compile.md"
