"""A stand-in for the issue's speed anchor: 30 dated taxa, 11,029 sites, about 224 site patterns, HKY+G4.

    python validation/dated/simulate_anchor.py OUTDIR

writes OUTDIR/alignment.fasta and OUTDIR/dates.tsv (decimal years, exact). A
constant-size coalescent tree (theta = 20 years) with tips sampled uniformly
over 1990-2010, a strict clock at 2.1e-4 substitutions/site/year (chosen so
that the patterns come to about 224, as in the anchor), HKY kappa 6 with
frequencies (0.3, 0.2, 0.2, 0.3) and Gamma shape 0.5.
"""

import sys
from pathlib import Path

import numpy as np

import jaxphylo as jp
from jaxphylo.inference.dated import rooted_time_tree


def coalescent_tree(ages, theta, rng):
    """`(parents, heights)` of a serially sampled coalescent tree with constant theta."""
    n = len(ages)
    order = list(np.argsort(ages))
    parents = np.full(2 * n - 1, -1)
    heights = np.concatenate([ages, np.zeros(n - 1)])
    lineages, t, new = [], 0.0, n
    while new < 2 * n - 1:
        while order and ages[order[0]] <= t:
            lineages.append(order.pop(0))
        k = len(lineages)
        wait = rng.exponential(theta * 2 / (k * (k - 1))) if k > 1 else np.inf
        if order and t + wait >= ages[order[0]]:
            t = ages[order[0]]
            continue
        t += wait
        i, j = rng.choice(k, 2, replace=False)
        parents[lineages[i]] = parents[lineages[j]] = new
        heights[new] = t
        lineages = [x for q, x in enumerate(lineages) if q not in (i, j)] + [new]
        new += 1
    return parents, heights


def main(out: Path) -> None:
    rng = np.random.default_rng(2024)
    taxa = [f"virus{i:02d}" for i in range(30)]
    years = np.round(rng.uniform(1990, 2010, 30), 2)
    years[0] = 2010.0
    parents, heights = coalescent_tree(2010.0 - years, 20.0, rng)
    tree = rooted_time_tree(parents, heights, taxa)
    model = jp.parse_model("HKY{6}+F{0.3,0.2,0.2,0.3}+G4{0.5}")
    alignment = jp.simulate(jp.Tree(2.1e-4 * tree.branch_lengths, tree.topology), model, 11029, seed=7)
    out.mkdir(parents=True, exist_ok=True)
    (out / "alignment.fasta").write_text("".join(f">{t}\n{s}\n" for t, s in zip(alignment.taxa, alignment.sequences)))
    (out / "dates.tsv").write_text("taxon\tdate\n" + "".join(f"{t}\t{y:.2f}\n" for t, y in zip(taxa, years)))
    print(f"{alignment.site_patterns().num_patterns} patterns; root {2010 - heights.max():.1f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
