#!/usr/bin/env bash
# Issue #39 on one GPU (an H200): which of the dated sampler's moves move rsv2's tree (129 taxa), under each preset
# weight set of moves.py in turn: 32 chains sampling for 75 s each (compilation, about a minute more, apart; the
# first 3,000 generations tune the moves and are left out), one JSON per weight set, then the table.
#
#   validation/dated/moves_gpu.sh OUT [DATA]
#
# OUT: the folder for rsv2_<preset>.json and table.md. DATA: the folder holding rsv2/ (alignment.fasta, dates.tsv),
# default /work/shared/data. CHAINS, SAMPLING_SECONDS and PYTHON in the environment change the chains (32-64), the
# seconds of sampling per weight set and the interpreter; PRESETS the weight sets (default: all four).
set -euo pipefail
out=${1:?usage: $0 OUT [DATA]}
data=${2:-/work/shared/data}
here=$(dirname "$0")
python=${PYTHON:-python}
mkdir -p "$out"
for preset in ${PRESETS:-default beast previous-default hmc-heavy}; do
    "$python" "$here/moves.py" run --data "$data" --dataset rsv2 --preset "$preset" --chains "${CHAINS:-32}" \
        --seconds "${SAMPLING_SECONDS:-75}" --generations 1000000 --tune 3000 --sample-every 40 --block 25 \
        --seed 1 --out "$out/rsv2_$preset.json" || echo "rsv2 $preset failed: the table leaves it out" >&2
done
if "$python" -c "import arviz" 2>/dev/null; then
    "$python" "$here/moves.py" summarise "$out"/rsv2_*.json | tee "$out/table.md"
else
    echo "no ArviZ here: run moves.py summarise $out/rsv2_*.json where it is" >&2
fi
