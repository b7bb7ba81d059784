"""1,000 non-parametric bootstrap replicates climbed as one batch on one device, against IQ-TREE 2's `-b`.

What a GPU affords that IQ-TREE's users skip for the ultrafast bootstrap: real replicates, each its own
resampled columns, BIONJ start and NNI climb under the ML model (`ml.bootstrap`; a fast bootstrap: no
perturbation per replicate, unlike IQ-TREE's full search per replicate). For each case the ML tree is the
one IQ-TREE found (`validation/ml/iqtree_<case>_nt1.treefile`, else BIONJ) fitted by `ml.fit` (GTR+G4);
then `ml.bootstrap(..., replicates=R, batch=B)` for each `--batches` B, timed in one process: the first call
compiles the batch's programs (cold), `--warm` repeats the one-batch run (steady state). Peak device memory
is the allocator's high-water mark after each call.

IQ-TREE (`iqtree2 -b K -nt 1 -seed 1`, K small: `--iqtree-replicates`) runs K + 1 full searches; its cost
for R replicates is the time per search times R + 1. The lent GPU machine has no IQ-TREE: run there with
`--no-iqtree`, then here `--references-for THAT.json` adds IQ-TREE on this CPU and prints the table.

    python benchmarks/bootstrap.py --cases DS1,rsv2 --batches 1000 --warm --no-iqtree   # on the GPU
    python benchmarks/bootstrap.py --references-for benchmarks/results/bootstrap-gpu.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import SHARED_DATA, device_record  # noqa: E402

MODEL = "GTR+G4"
IQTREE_TREES = Path(__file__).resolve().parents[1] / "validation" / "ml"


def ml_result(alignment, case: str):
    """The ML tree and model the replicates are drawn for: IQ-TREE's tree (or BIONJ), fitted here."""
    import jaxphylo as jp
    from jaxphylo import ml

    path = IQTREE_TREES / f"iqtree_{case}_nt1.treefile"
    tree = jp.read_tree(path) if path.exists() else jp.bionj(jp.distances(alignment, "k2p"), alignment.taxa)
    return ml.fit(alignment, tree, MODEL)


def peak_bytes() -> int:
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return int(stats.get("peak_bytes_in_use", 0))


def run_ours(case: str, data: Path, replicates: int, batches: list[int], warm: bool, seed: int) -> dict:
    import jaxphylo as jp
    from jaxphylo import ml

    alignment = jp.read_alignment(data / case / "alignment.fasta")
    start = time.perf_counter()
    result = ml_result(alignment, case)
    row = {"case": case, "taxa": len(alignment.taxa), "sites": alignment.num_sites, "replicates": replicates,
           "fit_seconds": round(time.perf_counter() - start, 2), "log_likelihood": float(result.log_likelihood),
           "runs": []}
    supports = {}
    for batch, label in [(b, "cold") for b in batches] + ([(batches[0], "warm")] if warm else []):
        start = time.perf_counter()
        found, _ = ml.bootstrap(alignment, result, replicates=replicates, seed=seed, batch=batch)
        seconds = time.perf_counter() - start
        supports.setdefault(batch, found)
        row["runs"].append({"batch": batch, "call": label, "seconds": round(seconds, 2),
                            "replicates_per_second": round(replicates / seconds, 2),
                            "peak_device_bytes": peak_bytes()})
        print(f"{case}: {replicates} replicates, batch {batch} ({label}): {seconds:.1f} s", flush=True)
    values = list(supports.values())
    row["mean_support"] = round(sum(values[0].values()) / len(values[0]), 2)
    row["largest_support_difference_between_batches"] = max(
        (abs(v[s] - values[0][s]) for v in values[1:] for s in values[0]), default=0.0)
    return row


def run_iqtree(case: str, data: Path, replicates: int, seed: int) -> dict:
    binary = shutil.which("iqtree2") or "iqtree2"
    with tempfile.TemporaryDirectory() as work:
        command = [binary, "-s", str(data / case / "alignment.fasta"), "-m", MODEL, "-b", str(replicates),
                   "-nt", "1", "-seed", str(seed), "-pre", f"{work}/boot", "-redo", "-quiet", "-keep-ident"]
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        seconds = time.perf_counter() - start
    return {"command": " ".join(command[:1] + ["-s", "ALN"] + command[3:11]), "replicates": replicates,
            "seconds": round(seconds, 2), "seconds_per_search": round(seconds / (replicates + 1), 3)}


def table(record: dict) -> None:
    print(f"\n{'case':<8} {'taxa':>5} {'R':>5} {'batch':>6} {'call':>5} {'ours s':>8} {'GiB':>6} "
          f"{'IQ-TREE -b R s (projected)':>27} {'ratio':>7}")
    for row in record["rows"]:
        iq = row.get("iqtree")
        projected = None if iq is None else iq["seconds_per_search"] * (row["replicates"] + 1)
        for run in row["runs"]:
            ratio = "" if projected is None else f"{projected / run['seconds']:.0f}x"
            print(f"{row['case']:<8} {row['taxa']:>5} {row['replicates']:>5} {run['batch']:>6} {run['call']:>5} "
                  f"{run['seconds']:>8.1f} {run['peak_device_bytes'] / 2**30:>6.1f} "
                  f"{'' if projected is None else f'{projected:.0f}':>27} {ratio:>7}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="DS1,rsv2")
    parser.add_argument("--replicates", type=int, default=1000)
    parser.add_argument("--batches", default="1000,100", help="replicates climbed together, one run each")
    parser.add_argument("--warm", action="store_true", help="repeat the first batch size (compiled)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data", type=Path, default=SHARED_DATA, help="a folder of CASE/alignment.fasta")
    parser.add_argument("--no-iqtree", action="store_true")
    parser.add_argument("--iqtree-replicates", type=int, default=10)
    parser.add_argument("--references-for", help="a JSON written with --no-iqtree: add IQ-TREE on this machine")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args()
    if args.references_for:
        path = Path(args.references_for)
        record = json.loads(path.read_text())
    else:
        record = device_record("bootstrap")
        record["command"] = " ".join(sys.argv)
        for case in args.cases.split(","):
            record["rows"].append(run_ours(case, args.data, args.replicates, [int(b) for b in args.batches.split(",")],
                                           args.warm, args.seed))
        path = Path(args.out) / f"bootstrap-{record['platform']}.json"
    if not args.no_iqtree:
        for row in record["rows"]:
            row["iqtree"] = run_iqtree(row["case"], args.data, args.iqtree_replicates, args.seed)
        record["iqtree_note"] = ("IQ-TREE 2 on this machine's CPU, one thread; projected to R replicates as its time "
                                 "per full search times R + 1 (K bootstrap searches and the ML search)")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))
    table(record)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
