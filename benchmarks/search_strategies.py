"""Escaping local optima: IQ-TREE-style perturbation against independent searches batched on the device.

Two ways to spend a search's time after the first hill climb, compared by the
best log-likelihood they reach per second:

- `perturbation`: one BIONJ start; then rounds of random NNIs on half the
  edges of `--batch` copies of the best trees, climbed together, until
  `--patience` perturbed trees in a row bring nothing (IQ-TREE's scheme);
- `independent`: `--starts` starts (BIONJ and randomised stepwise-addition
  parsimony trees) hill-climbed together as one batch (NNI, then SPR on the
  best), and no perturbation.

Each runs twice in the process; the second (warm) run's trace of (seconds,
best log L) is reported, with the compile time (cold minus warm) apart, next
to `iqtree2 -s ALN -m GTR+G4 -seed 1 -nt 1` on the same machine in the same
run. Writes `benchmarks/results/search_strategies-<platform>.json`.

    python benchmarks/search_strategies.py --cases DS1,DS2,DS3 --patience 20 --starts 8
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import jaxphylo as jp
from jaxphylo import ml
from _common import device_record
from ml_search import MODEL, load_case, run_iqtree


def run_strategy(alignment, settings: ml.SearchSettings, starts: int) -> dict:
    """Cold and warm searches; the warm one's trace `[(seconds, best log L)]`."""
    runs = []
    for _ in range(2):
        trace = []
        start = time.perf_counter()
        result = ml.search(alignment, MODEL, starts=starts, settings=settings, seed=1,
                           progress=lambda r, best, seconds: trace.append((seconds, best)))
        runs.append((time.perf_counter() - start, result, trace))
    (cold, _, _), (warm, result, trace) = runs
    return {"cold_seconds": cold, "warm_seconds": warm, "compile_seconds": cold - warm,
            "log_likelihood": result.log_likelihood, "rounds": result.search_rounds, "trace": trace,
            "tree": result.tree}


def best_by(trace, seconds: float) -> float | None:
    reached = [best for t, best in trace if t is not None and t <= seconds]
    return max(reached) if reached else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="DS1,DS2,DS3")
    parser.add_argument("--patience", type=int, default=20, help="perturbation: unsuccessful perturbed trees")
    parser.add_argument("--batch", type=int, default=4, help="perturbation: copies perturbed and climbed together")
    parser.add_argument("--starts", type=int, default=8, help="independent: starts climbed as one batch")
    parser.add_argument("--iqtree", default=shutil.which("iqtree2") or "iqtree2")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args()

    record = device_record("search_strategies")
    record.update(model=MODEL, cpu_count=os.cpu_count(), jaxphylo=jp.__version__, patience=args.patience,
                  batch=args.batch, starts=args.starts)
    strategies = {"perturbation": (ml.SearchSettings(batch=args.batch, patience=args.patience), 1),
                  "independent": (ml.SearchSettings(batch=args.starts, patience=0), args.starts)}
    print(f"{'case':<8}{'strategy':<14}{'warm s':>8}{'compile s':>10}{'log L':>14}{'IQ-TREE -nt 1':>15}"
          f"{'IQ s':>7}{'diff':>8}{'RF to IQ':>9}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases.split(","):
            alignment_path = load_case(case, Path(tmp))
            alignment = jp.read_alignment(alignment_path)
            iq = run_iqtree(args.iqtree, alignment_path, "1", Path(tmp), 3600)
            iq_tree = jp.parse_newick(iq.pop("tree"))
            row = {"case": case, "taxa": len(alignment.taxa), "sites": alignment.num_sites, "iqtree": iq}
            for name, (settings, starts) in strategies.items():
                ours = run_strategy(alignment, settings, starts)
                ours["robinson_foulds_to_iqtree"] = ml.robinson_foulds(ours.pop("tree"), iq_tree)
                row[name] = ours
                print(f"{case:<8}{name:<14}{ours['warm_seconds']:>8.1f}{ours['compile_seconds']:>10.1f}"
                      f"{ours['log_likelihood']:>14.3f}{iq['log_likelihood']:>15.3f}{iq['seconds']:>7.1f}"
                      f"{ours['log_likelihood'] - iq['log_likelihood']:>+8.3f}{ours['robinson_foulds_to_iqtree']:>9}",
                      flush=True)
            # Better trees per second: each strategy's best log L by the time the faster one finished.
            horizon = min(row[name]["warm_seconds"] for name in strategies)
            row["best_by_shorter_run"] = {name: best_by(row[name]["trace"], horizon) for name in strategies}
            row["horizon_seconds"] = horizon
            print(f"{'':<8}best log L by {horizon:.1f} s: " +
                  ", ".join(f"{k} {v:.3f}" if v is not None else f"{k} -" for k, v in
                            row["best_by_shorter_run"].items()), flush=True)
            record["rows"].append(row)
            path = Path(args.out) / f"search_strategies-{record['platform']}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record, indent=1, default=float))
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
