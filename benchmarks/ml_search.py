"""Maximum-likelihood tree search against IQ-TREE 2 on the same machine, in the same run.

For each case: `jaxphylo.ml.search` (GTR+G4, default settings, IQ-TREE's regime,
unless `--patience`/`--starts`/... are given; `--fast`: `SearchSettings.fast()`) timed cold (compilation included)
and, for the small cases, warm (a second identical search in the same
process: the difference is compile time); then `iqtree2 -s ALN -m GTR+G4
-seed 1` with `-nt 1` and `-nt AUTO`. Prints a table (time, log L, ratio) and
writes JSON (device, versions, sizes, times, peak memory) to
`benchmarks/results/ml_search-<platform>.json` (merged with earlier cases).

    python benchmarks/ml_search.py --cases DS1,DS2,DS3
    python benchmarks/ml_search.py --cases sim1000 --patience 8 --iqtree-timeout 480

Cases: DS1, DS2, DS3, carnivores (../shared/data or .devdata), sim1000 (1,000
taxa x 10,000 sites simulated under GTR+G4 on a random tree, seed 1).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax

import jaxphylo as jp
from jaxphylo import ml
from _common import SHARED_DATA, device_record

MODEL = "GTR+G4"


def load_case(name: str, workdir: Path) -> Path:
    if name == "sim1000":
        path = workdir / "sim1000.fasta"
        if not path.exists():
            taxa = [f"t{i}" for i in range(1000)]
            tree = jp.random_topology_tree(taxa, seed=1, mean_branch_length=0.03)
            model = jp.parse_model("GTR{1.2,3.5,0.8,1.1,4.2}+F{0.3,0.2,0.25,0.25}+G4{0.6}")
            alignment = jp.simulate(tree, model, 10_000, seed=1)
            with open(path, "w") as handle:
                handle.writelines(f">{t}\n{s}\n" for t, s in zip(alignment.taxa, alignment.sequences))
        return path
    return SHARED_DATA / name / "alignment.fasta"


def run_iqtree(binary: str, alignment: Path, threads: str, workdir: Path, timeout: float) -> dict:
    prefix = workdir / f"iq_{alignment.stem}_{threads}"
    command = [binary, "-s", str(alignment), "-m", MODEL, "-seed", "1", "-nt", threads, "-pre", str(prefix),
               "-redo", "-quiet", "-keep-ident"]
    start = time.perf_counter()
    try:
        subprocess.run(command, check=True, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"threads": threads, "seconds": None, "log_likelihood": None, "note": f"not finished in {timeout} s"}
    seconds = time.perf_counter() - start
    text = Path(f"{prefix}.iqtree").read_text()
    log_l = float(re.search(r"Log-likelihood of the tree: (-?[\d.]+)", text).group(1))
    chosen = re.search(r"Kernel: .* (\d+) threads", Path(f"{prefix}.log").read_text())
    return {"threads": threads, "threads_used": int(chosen.group(1)) if chosen else None, "seconds": seconds,
            "log_likelihood": log_l, "tree": Path(f"{prefix}.treefile").read_text().strip()}


def peak_memory() -> dict:
    device = jax.devices()[0]
    stats = device.memory_stats() if device.platform == "gpu" else None
    return {"device_peak_bytes": stats.get("peak_bytes_in_use") if stats else None,
            "host_max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def run_ours(alignment, settings: ml.SearchSettings, warm: bool) -> dict:
    start = time.perf_counter()
    result = ml.search(alignment, MODEL, settings=settings, seed=1)
    cold = time.perf_counter() - start
    row = {"cold_seconds": cold, "log_likelihood": result.log_likelihood, "search_rounds": result.search_rounds,
           "model": result.model_string, "tree": None}
    if warm:
        start = time.perf_counter()
        again = ml.search(alignment, MODEL, settings=settings, seed=1)
        row["warm_seconds"] = time.perf_counter() - start
        row["compile_seconds"] = cold - row["warm_seconds"]
        assert abs(again.log_likelihood - result.log_likelihood) < 1e-6
    row["tree_object"] = result.tree
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="DS1,DS2,DS3,carnivores")
    parser.add_argument("--patience", type=int, default=None, help="default: SearchSettings' (IQ-TREE's 100)")
    parser.add_argument("--starts", type=int, default=None, help="default: SearchSettings' (IQ-TREE's -ninit 100)")
    parser.add_argument("--top", type=int, default=None, help="default: SearchSettings' (IQ-TREE's -ntop 20)")
    parser.add_argument("--fast", action="store_true", help="SearchSettings.fast(): one start, NNI, SPR at radius 5")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--radius", type=int, default=None)
    parser.add_argument("--lengths-method", default="auto", choices=("auto", "lbfgs", "newton"))
    parser.add_argument("--max-seconds", type=float, default=None, help="stop our search after this long")
    parser.add_argument("--iqtree", default=shutil.which("iqtree2") or "iqtree2")
    parser.add_argument("--iqtree-timeout", type=float, default=3600)
    parser.add_argument("--iqtree-threads", default="1,AUTO")
    parser.add_argument("--no-warm", action="store_true", help="skip the second (warm) search")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args()

    record = device_record("ml_search")
    record.update(model=MODEL, cpu_count=os.cpu_count(), jaxphylo=jp.__version__)
    path = Path(args.out) / f"ml_search-{record['platform']}.json"
    if path.exists():
        record["rows"] = [r for r in json.loads(path.read_text())["rows"]
                          if (r["case"], r["settings"].get("lengths_method", "auto")) not in
                          {(c, args.lengths_method) for c in args.cases.split(",")}]
    options = {k: v for k, v in dict(patience=args.patience, batch=args.batch, radius=args.radius,
                                     lengths_method=args.lengths_method, max_seconds=args.max_seconds,
                                     starts=args.starts, top=args.top).items()
               if v is not None}
    settings = ml.SearchSettings.fast(**options) if args.fast else ml.SearchSettings(**options)
    version = subprocess.run([args.iqtree, "--version"], capture_output=True, text=True).stdout.splitlines()
    record["iqtree"] = version[0] if version else None
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for case in args.cases.split(","):
            alignment_path = load_case(case, workdir)
            alignment = jp.read_alignment(alignment_path)
            patterns = alignment.site_patterns().num_patterns
            print(f"# {case}: {len(alignment.taxa)} taxa, {alignment.num_sites} sites, {patterns} patterns",
                  flush=True)
            ours = run_ours(alignment, settings, warm=not args.no_warm and len(alignment.taxa) < 200)
            ours["tree"] = None
            iq = [run_iqtree(args.iqtree, alignment_path, t, workdir, args.iqtree_timeout)
                  for t in args.iqtree_threads.split(",")]
            tree = ours.pop("tree_object")
            for run in iq:
                if run.get("tree"):
                    other = jp.parse_newick(run.pop("tree"))
                    renamed = {name.replace(" ", "_"): name for name in alignment.taxa}
                    if set(other.taxa) != set(alignment.taxa):
                        other = jp.Tree(other.branch_lengths, jp.Topology(
                            other.topology.parent, tuple(renamed.get(t, t) for t in other.taxa), False))
                    run["robinson_foulds_to_ours"] = ml.robinson_foulds(tree, other)
            row = {"case": case, "taxa": len(alignment.taxa), "sites": alignment.num_sites, "patterns": patterns,
                   "settings": dict(settings.__dict__), "jaxphylo": ours, "iqtree": iq,
                   **peak_memory()}
            record["rows"].append(row)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record, indent=1, default=float))
            print_row(row)
    print(f"wrote {path}")


def print_row(row) -> None:
    ours = row["jaxphylo"]
    warm = f"{ours['warm_seconds']:.1f}" if "warm_seconds" in ours else "-"
    print(f"{'case':<12}{'ours cold s':>12}{'warm s':>8}{'ours logL':>15}  | IQ-TREE threads, s, logL, "
          f"ours/IQ time, logL diff, RF")
    print(f"{row['case']:<12}{ours['cold_seconds']:>12.1f}{warm:>8}{ours['log_likelihood']:>15.3f}")
    for run in row["iqtree"]:
        if run["seconds"] is None:
            print(f"{'':<47}| -nt {run['threads']}: {run['note']}")
            continue
        ratio = (ours.get("warm_seconds") or ours["cold_seconds"]) / run["seconds"]
        print(f"{'':<47}| -nt {run['threads']} ({run['threads_used']}): {run['seconds']:.1f} s, "
              f"{run['log_likelihood']:.3f}; {ratio:.2f}x; {ours['log_likelihood'] - run['log_likelihood']:+.3f}; "
              f"RF {run.get('robinson_foulds_to_ours')}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
