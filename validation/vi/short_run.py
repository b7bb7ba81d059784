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
from validation.vi.benchmark_ds import DATA, add_training_options, worst_split  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_training_options(parser, steps=3000, particles=VISettings.particles, anneal=0, lr=VISettings.learning_rate,
                         topology_rate=VISettings.topology_rate, population=1)
    args = parser.parse_args(argv)
    folder = Path(args.data) if Path(args.data).is_dir() else DATA / args.data
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
    if (worst := worst_split(result, folder)) is not None:
        difference, split = worst
        print(f"max split difference {difference:.3f} (q {split['q']:.3f}, golden {split['golden']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
