"""Short DS-benchmark fits on this CPU, for comparing settings (the figures in `README.md`'s CPU rows).

    python validation/vi/short_run.py --steps 3000 --seed 1                      # the defaults
    python validation/vi/short_run.py --steps 3000 --seed 1 --explore 0          # VIMCO on q's trees
    python validation/vi/short_run.py --steps 1500 --population 4 --selections 5

Prints the K-sample bound and the ELBO estimate every block with the seconds since the fit began (compilation
included, imports not), then the importance-sampled log ML and ELBO (200 particles x 2: a quick estimate, not the
benchmark's 1,000 x 10) and the largest split difference from DS1's golden posterior.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import jaxphylo as jp  # noqa: E402
from jaxphylo.inference.vi import VISettings, vi  # noqa: E402
from validation.mc3.golden import golden_split_probabilities  # noqa: E402

DATA = Path("/work/shared/data")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="DS1")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--particles", type=int, default=VISettings.particles)
    parser.add_argument("--anneal", type=int, default=0)
    parser.add_argument("--lr", type=float, default=VISettings.learning_rate)
    parser.add_argument("--topology-rate", type=float, default=VISettings.topology_rate)
    parser.add_argument("--proximity", type=float, default=VISettings.proximity)
    parser.add_argument("--explore", type=float, default=VISettings.explore)
    parser.add_argument("--population", type=int, default=1)
    parser.add_argument("--selections", type=int, default=VISettings.selections)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    folder = DATA / args.data
    alignment = jp.read_alignment(folder / "alignment.fasta")
    settings = VISettings(steps=args.steps, particles=args.particles, anneal=args.anneal, learning_rate=args.lr,
                          topology_rate=args.topology_rate, proximity=args.proximity, explore=args.explore,
                          population=args.population, selections=args.selections, block=100, repeats=2,
                          importance=200, tree_samples=10)
    began = time.perf_counter()

    def progress(step, bound, elbo):
        print(f"step {step} bound {bound:.1f} elbo {elbo:.1f} {time.perf_counter() - began:.0f}s", flush=True)

    result = vi(alignment, "JC", settings, seed=args.seed, progress=progress)
    summary = result.summary()
    print(f"log ML {summary['log_ml_mean']:.2f}  ELBO {summary['elbo_mean']:.2f}")
    golden = folder / "topology_posterior_pooled.tsv"
    if golden.exists():
        reference, ours = golden_split_probabilities(golden), result.split_frequencies()
        differences = {s: abs(ours.get(s, 0.0) - reference.get(s, 0.0)) for s in set(ours) | set(reference)}
        worst = max(differences, key=differences.get)
        print(f"max split difference {differences[worst]:.3f} (q {ours.get(worst, 0.0):.3f}, "
              f"golden {reference.get(worst, 0.0):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
