#!/usr/bin/env bash
# How the CUDA results in benchmarks/ were made: on a GPU machine that has its own Python with
# PyTorch but not the course's virtual environment (no package index to build one from).
#
#   bash benchmarks/run_on_gpu.sh OUTDIR [PART ...]
#
# PARTs, run in the order given (default: all of them):
#   env       the GPU, driver and library versions
#   bench     python -m tools.bench           -> benchmarks/results-cuda.md
#   backward  python -m tools.bench_backward  -> benchmarks/results-backward-cuda.md
#   flex      python -m tools.bench --flex    -> benchmarks/results-flex-cuda.md
#   record    python -m tools.record_gpu      -> data/gpu/<gpu name>.json (notebook 05 draws it)
#   05 10 11  execute that notebook top to bottom on the GPU (nbclient; needs ipykernel and nbclient
#             importable) -> OUTDIR/NN_*.cuda.ipynb; the notebooks in notebooks/ are left alone
#
# Each part's results are copied to OUTDIR as soon as it ends, and a failing part does not stop
# the next one; the script's exit status is the number of parts that failed.
set -u
OUT=${1:?usage: bash benchmarks/run_on_gpu.sh OUTDIR [PART ...]}
shift
PARTS=${*:-env bench backward flex record 05 10 11}
mkdir -p "$OUT"
cd "$(dirname "$0")/.." || exit 1
export PYTHONUNBUFFERED=1 PYTHONHASHSEED=0 MPLBACKEND=module://matplotlib_inline.backend_inline
PY=${PYTHON:-python3}
failed=0

execute_notebook() {  # $1: the notebook's number
    local nb
    nb=$(ls notebooks/"$1"_*.ipynb) || return 1
    "$PY" - "$nb" "$OUT/$(basename "${nb%.ipynb}").cuda.ipynb" <<'EOF'
import sys, time
import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

src, dst = sys.argv[1], sys.argv[2]
nb = nbformat.read(src, as_version=4)
start = time.perf_counter()
try:
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": "notebooks"}}).execute()
finally:
    nbformat.write(nb, dst)  # what ran, errors included
    print(f"{src}: {time.perf_counter() - start:.1f} s", flush=True)
EOF
}

for part in $PARTS; do
    start=$(date +%s)
    case $part in
        env)
            nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
            "$PY" -c "import sys, torch, numpy; print('python', sys.version.split()[0], '| torch', torch.__version__, '| CUDA', torch.version.cuda, '| numpy', numpy.__version__, '|', torch.cuda.get_device_name())" ;;
        bench) "$PY" -m tools.bench && cp benchmarks/results-cuda.md "$OUT"/ ;;
        backward) "$PY" -m tools.bench_backward && cp benchmarks/results-backward-cuda.md "$OUT"/ ;;
        flex) "$PY" -m tools.bench --flex && cp benchmarks/results-flex-cuda.md "$OUT"/ ;;
        record) "$PY" -m tools.record_gpu && cp data/gpu/*.json "$OUT"/ ;;
        [0-9][0-9]) execute_notebook "$part" ;;
        *) echo "unknown part: $part"; false ;;
    esac
    status=$?
    [ $status -ne 0 ] && failed=$((failed + 1))
    echo "== $part: exit $status after $(( $(date +%s) - start )) s"
done
exit $failed
