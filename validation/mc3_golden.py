"""jaxphylo's MC³ on DS1 against the 10-run MrBayes golden posterior (`topology_posterior_pooled.tsv`).

JC69, MrBayes's default priors, `--runs` (default 2) runs x 4 chains, heating 0.1. Prints and
saves (validation/mc3/results/jaxphylo_golden-<platform>.json): generations,
seconds, generations per second, ASDSF, the largest absolute difference
between our pooled split frequencies (25% burn-in) and the golden split
probabilities over splits with either >= 0.05, and whether the most frequent
sampled topology is the golden top topology. MrBayes's figures for the same
data and settings are in validation/mc3/results/mrbayes_reference.json
(`validation/mc3/mrbayes_reference.py`).

    python validation/mc3_golden.py --generations 400000 [--stop-asdsf 0.01]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "validation" / "mc3")]

import jaxphylo as jp  # noqa: E402
from golden import golden_split_probabilities, golden_topology_probabilities, split_of_side  # noqa: E402

DATA = next((p for p in (ROOT.parent / "shared" / "data" / "DS1", ROOT / ".devdata" / "DS1") if p.exists()), None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--generations", type=int, default=400_000)
    parser.add_argument("--sample-every", type=int, default=100)
    parser.add_argument("--stop-asdsf", type=float, default=None)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--block", type=int, default=100)
    parser.add_argument("--runs", type=int, default=2, help="independent runs, pooled (the golden pools 10)")
    parser.add_argument("--tag", default="", help="suffix of the results file")
    parser.add_argument("--fused-generations", type=int, default=0,
                        help="NNI and branch-multiplier generations per chain after each generation (one launch on a "
                             "GPU)")
    args = parser.parse_args()
    alignment = jp.read_alignment(DATA / "alignment.fasta")
    taxa = tuple(alignment.taxa)
    settings = jp.inference.MC3Settings(runs=args.runs, chains=4, generations=args.generations,
                                        sample_every=args.sample_every, stop_asdsf=args.stop_asdsf, block=args.block,
                                        fused_generations=args.fused_generations)
    began = time.perf_counter()
    result = jp.inference.mc3(alignment, "JC", settings=settings, seed=args.seed,
                              progress=lambda g, cold, a: print(f"{g}\t{cold}\tASDSF {a:.4f}\t"
                                                                f"{time.perf_counter() - began:.0f} s", flush=True))
    wall = time.perf_counter() - began
    ours = {split_of_side(s, taxa): float(f.mean()) for s, f in result.split_frequencies().items()}
    golden = golden_split_probabilities(DATA / "topology_posterior_pooled.tsv")
    considered = [s for s in set(ours) | set(golden) if max(ours.get(s, 0), golden.get(s, 0)) >= 0.05]
    worst = max(considered, key=lambda s: abs(ours.get(s, 0) - golden.get(s, 0)))
    counts = {}
    for run in result.runs:
        for sample in run.splits[run.kept(settings.burnin)]:
            key = frozenset(split_of_side(s, taxa) for s in sample)
            counts[key] = counts.get(key, 0) + 1
    top_ours = max(counts, key=counts.get)
    top_golden = max(golden_topology_probabilities(DATA / "topology_posterior_pooled.tsv").items(),
                     key=lambda item: item[1])[0]
    record = {
        "device": str(jax.devices()[0]), "jax": jax.__version__, "runs": args.runs, "seed": args.seed,
        "fused_generations": args.fused_generations,
        "xla_flags": os.environ.get("XLA_FLAGS", ""), "generations": result.generations,
        "seconds_total": wall, "seconds_sampling": result.seconds,
        "generations_per_second": result.generations / result.seconds, "asdsf": result.asdsf,
        "asdsf_trace": result.asdsf_trace, "acceptance": result.acceptance,
        "swap_rates": result.swap_rates.mean(0).tolist(),
        "max_split_difference": abs(ours.get(worst, 0) - golden.get(worst, 0)),
        "worst_split": sorted(worst), "worst_split_ours": ours.get(worst, 0), "worst_split_golden": golden.get(worst, 0),
        "top_topology_equal": top_ours == top_golden, "top_topology_frequency": counts[top_ours] / sum(counts.values()),
        "splits": sorted([[sorted(s), ours.get(s, 0), golden.get(s, 0)] for s in considered],
                         key=lambda row: -row[2]),
    }
    print(f"\n{'generations':>12} {'seconds':>8} {'gen/s':>7} {'ASDSF':>7} {'max |split diff|':>17} top equal")
    print(f"{result.generations:>12} {result.seconds:>8.1f} {record['generations_per_second']:>7.0f} "
          f"{result.asdsf:>7.4f} {record['max_split_difference']:>17.3f} {record['top_topology_equal']}")
    platform = jax.devices()[0].platform
    out = ROOT / "validation" / "mc3" / "results" / f"jaxphylo_golden-{platform}{args.tag}.json"
    out.write_text(json.dumps(record, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
