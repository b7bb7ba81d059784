"""Issue #42's 128-taxon set: variational inference against a long MC³ run of ours on one simulated alignment.

The set (`simulate FOLDER`): taxa t000..t127 on `jp.random_topology_tree` (seed 128, exponential edges of mean
0.1, the benchmark prior's Exponential(10)), 1,000 sites simulated under JC69 (seed 128): FOLDER/alignment.fasta
and FOLDER/true.tree. Both programs then sample the benchmark's posterior (JC69, uniform topologies, edges
i.i.d. Exponential(10)) with their own commands, and `compare` reads their folders:

    python validation/vi/sim128.py simulate .devdata/data/sim128
    python validation/vi/benchmark_ds.py --data .devdata/data/sim128 --minutes 55 --particles 20 --out vi128.json
    jaxphylo mcmc .devdata/data/sim128/alignment.fasta -m JC --generations 2000000 --out mc3_128
    python validation/vi/sim128.py compare --vi vi128 --mc3 mc3_128 --true .devdata/data/sim128/true.tree \
        --out validation/vi/results/sim128.json

An MC³ run stopped by `--max-time` before its `--generations` (the device runs it in pieces, `--resume` each
time) has only its `runR.trees`; `summarise FOLDER` writes what a finished run writes beside them (`splits.tsv`,
`consensus.tree`, `summary.json` with ASDSF), from those samples, with mcmc's 25% burn-in:

    python validation/vi/sim128.py summarise mc3_128

`compare` reports VI's ELBO and importance-sampled log ML (its `summary.json`), MC³'s ASDSF between runs (how
settled the reference is), the largest difference of q's split frequencies from MC³'s (mean over its runs; a
split either never sampled counts 0), and the RF distance of each majority consensus to the true tree.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import dendropy
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import jaxphylo as jp  # noqa: E402
from jaxphylo.inference.mc3 import RunSamples, consensus_newick, split_frequencies  # noqa: E402

TAXA = tuple(f"t{i:03d}" for i in range(128))
SEED, SITES, MEAN_EDGE = 128, 1000, 0.1


def simulate(folder: Path) -> None:
    tree = jp.random_topology_tree(TAXA, seed=SEED, mean_branch_length=MEAN_EDGE)
    alignment = jp.simulate(tree, jp.parse_model("JC"), SITES, seed=SEED)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "alignment.fasta", "w") as handle:
        handle.writelines(f">{taxon}\n{sequence}\n" for taxon, sequence in zip(alignment.taxa, alignment.sequences))
    jp.write_tree(tree, folder / "true.tree")
    print(f"{folder}: {len(TAXA)} taxa x {SITES} sites; the true tree's log L "
          f"{float(jp.log_likelihood(alignment, tree, jp.parse_model('JC'))):.3f}")


def read_run(path: Path) -> tuple[tuple, RunSamples]:
    """The taxa (translate order) and one run's samples from its `runR.trees`: each tree's splits (`jp.tree.splits`,
    the kernel's sides) with their edge lengths, and its terminal lengths in taxon order."""
    trees = dendropy.TreeList.get(path=str(path), schema="nexus", rooting="force-unrooted",
                                  preserve_underscores=True)
    taxa = tuple(taxon.label for taxon in trees.taxon_namespace)
    run = RunSamples()
    for k, dtree in enumerate(trees):
        tree = jp.io.from_dendropy(dtree, path, None)
        lengths = np.asarray(tree.branch_lengths)
        tips = np.zeros(len(taxa))
        tips[[taxa.index(t) for t in tree.taxa]] = lengths[:len(tree.taxa)]
        run.generations.append(int(dtree.label.split(".")[1]) if dtree.label else k)
        run.splits.append({split: float(lengths[node]) for split, node in jp.tree.splits(tree).items()})
        run.tip_lengths.append(tips)
    return taxa, run


def summarise(folder: Path, burnin: float = 0.25, min_frequency: float = 0.1) -> None:
    """`splits.tsv`, `consensus.tree` and `summary.json` of a stopped `jaxphylo mcmc` run, from its tree files."""
    paths = sorted(folder.glob("run*.trees"), key=lambda p: int(p.stem[3:]))
    read = [read_run(path) for path in paths]
    taxa, runs = read[0][0], [run for _, run in read]
    frequencies = split_frequencies(runs, burnin)
    spread = [float(np.std(f, ddof=1)) for f in frequencies.values() if np.max(f) >= min_frequency]
    with open(folder / "splits.tsv", "w") as handle:
        handle.write("split\t" + "\t".join(f"run{r + 1}" for r in range(len(runs))) + "\tmean\tsd\n")
        for split, f in sorted(frequencies.items(), key=lambda item: (-np.mean(item[1]), sorted(item[0]))):
            handle.write(",".join(sorted(split)) + "\t" + "\t".join(f"{x:.4f}" for x in f) +
                         f"\t{np.mean(f):.4f}\t{np.std(f, ddof=1):.4f}\n")
    (folder / "consensus.tree").write_text(consensus_newick(runs, taxa, burnin) + "\n")
    summary = {"generations": min(run.generations[-1] for run in runs),
               "samples_per_run": min(len(run.splits) for run in runs), "runs": len(runs), "burnin": burnin,
               "asdsf": float(np.mean(spread)),
               "note": "summarised from the tree files of a run stopped by --max-time (sim128.py summarise)"}
    (folder / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))


def read_splits(path: Path) -> dict:
    """`{split: frequency}` from a `splits.tsv` of `vi` (column `frequency`) or `mcmc` (column `mean`)."""
    with open(path) as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    column = "frequency" if "frequency" in rows[0] else "mean"
    return {frozenset(row["split"].split(",")): float(row[column]) for row in rows}


def compare(vi_folder: Path, mc3_folder: Path, true_tree: Path, out: Path) -> None:
    q, reference = read_splits(vi_folder / "splits.tsv"), read_splits(mc3_folder / "splits.tsv")
    differences = {s: abs(q.get(s, 0.0) - reference.get(s, 0.0)) for s in set(q) | set(reference)}
    worst = max(differences, key=lambda s: (differences[s], sorted(s)))  # ties: the same split every run
    truth = jp.read_tree(true_tree)
    vi_summary = json.loads((vi_folder / "summary.json").read_text())
    mc3_summary = json.loads((mc3_folder / "summary.json").read_text())
    report = {
        "set": f"{len(TAXA)} taxa x {SITES} sites, JC69, seed {SEED} (validation/vi/sim128.py simulate)",
        "vi": {"steps": vi_summary["steps"], "elbo": [vi_summary["elbo_mean"], vi_summary["elbo_sd"]],
               "log_ml_importance": [vi_summary["log_ml_mean"], vi_summary["log_ml_sd"]],
               "rf_consensus_to_true_tree": jp.ml.robinson_foulds(jp.read_tree(vi_folder / "consensus.tree"), truth)},
        "mc3": {"generations": mc3_summary["generations"], "runs": mc3_summary.get("runs"),
                "asdsf": mc3_summary["asdsf"],
                "rf_consensus_to_true_tree": jp.ml.robinson_foulds(jp.read_tree(mc3_folder / "consensus.tree"), truth)},
        "max_split_difference": differences[worst],
        "mean_split_difference_where_either_reaches_0.1": float(np.mean(
            [d for split, d in differences.items() if max(q.get(split, 0.0), reference.get(split, 0.0)) >= 0.1])),
        "mc3_majority_splits_in_q_majority": [
            sum(1 for split, f in reference.items() if f > 0.5 and q.get(split, 0) > 0.5),
            sum(1 for f in reference.values() if f > 0.5)],
        "worst_split": {"taxa": sorted(worst), "q": q.get(worst, 0.0), "mc3": reference.get(worst, 0.0)},
        "splits_within_0.05": differences[worst] <= 0.05,
    }
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("simulate").add_argument("folder", type=Path)
    commands.add_parser("summarise").add_argument("folder", type=Path)
    both = commands.add_parser("compare")
    for name in ("--vi", "--mc3", "--true", "--out"):
        both.add_argument(name, type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "simulate":
        simulate(args.folder)
    elif args.command == "summarise":
        summarise(args.folder)
    else:
        compare(args.vi, args.mc3, args.true, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
