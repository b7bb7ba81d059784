#!/usr/bin/env bash
# One BEAST 1.10.4 reference run: write the XML, run BEAST single-threaded,
# time it with the wall clock, summarise the log and trees as JSON.
#
# usage: validation/dated/run_beast.sh DATASET CLOCK PRIOR CHAIN_LENGTH LOG_EVERY [CUTOFF [K]]
#   DATASET  a folder under $DATA_ROOT (default /work/shared/data) holding
#            alignment.fasta and dates.tsv, e.g. dengue4_env or rsv2
#   CLOCK    strict | relaxed;  PRIOR  constant | skygrid
#   SEED     (environment, default 1) another seed writes beast/replicates/NAME-seedN.json: BEAST beside itself,
#            the Monte-Carlo error of its own summaries (compare.py reads beast/*.json only)
#
# Needs: apt-get install -y beast-mcmc libhmsbeagle1v5 libjlapack-java   (see README.md)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
data_root="${DATA_ROOT:-/work/shared/data}"
dataset="$1"; clock="$2"; prior="$3"; chain="$4"; every="$5"
cutoff="${6:-}"; k="${7:-10}"
seed="${SEED:-1}"
name="${dataset}_${clock}_${prior}"
outdir="$here/beast"; raw="$outdir/raw"
if [[ "$seed" != 1 ]]; then
    name="$name-seed$seed"; outdir="$here/beast/replicates"
fi
mkdir -p "$raw" "$outdir"

extra=()
meta=()
if [[ "$prior" == skygrid ]]; then
    extra=(--skygrid-cutoff "$cutoff" --skygrid-intervals "$k")
    meta=(--meta "skygrid_cutoff=$cutoff" --meta "skygrid_intervals=$k")
fi

python3 "$here/beast_xml.py" \
    --alignment "$data_root/$dataset/alignment.fasta" --dates "$data_root/$dataset/dates.tsv" \
    --clock "$clock" --tree-prior "$prior" --chain-length "$chain" --log-every "$every" \
    "${extra[@]}" --prefix "$name" --out "$outdir/$name.xml"

# Debian's beast-mcmc wrapper leaves netlib/jlapack (needed by the skygrid's
# GMRF block-update operator through MTJ) off the class path; the wrapper
# prepends $CLASSPATH.
J=/usr/share/java
export CLASSPATH="$J/netlib-java.jar:$J/f2jutil.jar:$J/jlapack-blas.jar:$J/jlapack-lapack.jar:$J/jlapack-xerbla.jar"
# one core: serial garbage collector, one BEAST thread, no BEAGLE threads
export JAVA_TOOL_OPTIONS="-XX:+UseSerialGC"
beagle=(-beagle_SSE -beagle_threading_off)
if ! beast-mcmc -beagle_info 2>/dev/null | grep -q "BEAGLE resources available"; then
    beagle=(-beagle_off)
fi

cd "$raw"
t0=$(date +%s.%N)
beast-mcmc -threads 1 -seed "$seed" -overwrite "${beagle[@]}" "$outdir/$name.xml" > "$name.out" 2>&1
t1=$(date +%s.%N)
secs=$(python3 -c "print(round($t1 - $t0, 2))")
echo "$name: $secs s wall" >&2

most_recent=$(python3 -c "
import sys
v=[float(l.split('\t')[1]) for l in list(open('$data_root/$dataset/dates.tsv'))[1:] if l.strip()]
print(max(v))")
cd "$here/beast"   # relative paths (raw/NAME.log) in the JSON
# summarise.py needs arviz: PYTHON=/path/to/venv/bin/python when the system python3 lacks it
"${PYTHON:-python3}" "$here/summarise.py" "raw/$name.log" "raw/$name.trees" \
    --seconds "$secs" --chain-length "$chain" --most-recent-tip "$most_recent" \
    --meta "dataset=$dataset" --meta "clock=$clock" --meta "tree_prior=$prior" \
    --meta "program=\"BEAST 1.10.4 (Debian beast-mcmc 1.10.4+dfsg-5)\"" \
    --meta "command=\"beast-mcmc -threads 1 -seed $seed -overwrite ${beagle[*]} $name.xml\"" \
    --meta "beagle=\"${beagle[*]}\"" --meta "log_every=$every" \
    --meta "most_recent_tip=$most_recent" "${meta[@]}" \
    --out "$outdir/$name.json"
echo "wrote $outdir/$name.json" >&2
