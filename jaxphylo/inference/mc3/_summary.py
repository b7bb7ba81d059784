"""What MC³ samples become: split frequencies, ASDSF, consensus and MAP trees, and the files MrBayes users read.

A split is written as the set of taxa on the side without the first taxon
(`ml.splits`' convention). ASDSF is MrBayes's: after discarding the first
`burnin` fraction of each run's samples, the standard deviation across runs
(n - 1 in the denominator) of every split's frequency, averaged over the
splits whose frequency reaches `min_frequency` in at least one run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpyro.diagnostics import effective_sample_size, gelman_rubin

from ...io import newick_string, quoted
from ...tree import TreeBatch, kernel_splits


@dataclass
class RunSamples:
    """One run's cold-chain samples on the host: generation, splits with their edge lengths, scalar columns."""

    generations: list = field(default_factory=list)
    splits: list = field(default_factory=list)  # per sample: {split: edge length}
    tip_lengths: list = field(default_factory=list)  # per sample: [N] terminal edge lengths
    columns: list = field(default_factory=list)  # per sample: [values] (log L, log prior, tree length, params)

    def add(self, generation: int, parent: np.ndarray, lengths: np.ndarray, taxa, values) -> None:
        self.generations.append(int(generation))
        self.splits.append(sample_splits(parent, lengths, taxa))
        self.tip_lengths.append(tip_lengths(parent, lengths, len(taxa)))
        self.columns.append(np.asarray(values, float))

    def to_plain(self) -> dict:
        """Lists, tuples and arrays in a fixed order (a checkpoint's bytes must not depend on set order)."""
        splits = [tuple(sorted((tuple(sorted(k)), v) for k, v in sample.items())) for sample in self.splits]
        return {"generations": list(self.generations), "splits": splits,
                "tip_lengths": np.asarray(self.tip_lengths), "columns": np.asarray(self.columns)}

    @classmethod
    def from_plain(cls, plain: dict) -> "RunSamples":
        splits = [{frozenset(k): v for k, v in sample} for sample in plain["splits"]]
        return cls(list(plain["generations"]), splits, list(plain["tip_lengths"]), list(plain["columns"]))

    def kept(self, burnin: float) -> slice:
        return slice(int(len(self.splits) * burnin), None)


def sample_splits(parent: np.ndarray, lengths: np.ndarray, taxa) -> dict:
    """`{split: edge length}` of a kernel tree rooted on tip 0's edge (the root's zero branch carries none)."""
    found = kernel_splits(parent, tuple(taxa))
    return {split: float(lengths[node]) for node, split in enumerate(found) if split is not None}


def tip_lengths(parent: np.ndarray, lengths: np.ndarray, num_tips: int) -> np.ndarray:
    """Terminal edge lengths in taxon order (tip 0's kernel branch is its whole edge)."""
    return np.asarray(lengths[:num_tips], float)


def split_frequencies(runs: list[RunSamples], burnin: float) -> dict:
    """`{split: [frequency in each run]}` after burn-in."""
    counts: dict = {}
    for r, run in enumerate(runs):
        kept = run.splits[run.kept(burnin)]
        for sample in kept:
            for split in sample:
                counts.setdefault(split, np.zeros(len(runs)))[r] += 1.0 / max(len(kept), 1)
    return counts


def asdsf(runs: list[RunSamples], burnin: float, min_frequency: float) -> float:
    """Average standard deviation of split frequencies across runs (NaN with one run or no samples)."""
    if len(runs) < 2 or min(len(r.splits) for r in runs) == 0:
        return float("nan")
    spread = [np.std(f, ddof=1) for f in split_frequencies(runs, burnin).values() if np.max(f) >= min_frequency]
    return float(np.mean(spread)) if spread else 0.0


def mean_split_lengths(runs: list[RunSamples], burnin: float) -> dict:
    """Mean edge length of every split over the kept samples that contain it."""
    total: dict = {}
    for run in runs:
        for sample in run.splits[run.kept(burnin)]:
            for split, length in sample.items():
                s, n = total.get(split, (0.0, 0))
                total[split] = (s + length, n + 1)
    return {split: s / n for split, (s, n) in total.items()}


def consensus_newick(runs: list[RunSamples], taxa, burnin: float, min_frequency: float = 0.5,
                     labels: bool = True) -> str:
    """Majority-rule consensus of the pooled kept samples: clades above `min_frequency`, each labelled with its
    posterior probability and carrying its mean edge length (tips: their mean terminal length).

    Splits above one half are compatible, so they nest: rooted at the first
    taxon, each one's parent is the smallest kept split that contains it.
    """
    everyone = frozenset(taxa[1:])
    # Splits are kept as the side without the least taxon name; rooted at the first taxon, a clade is the side
    # without that one (they differ whenever the alignment's first taxon is not the least name)
    def oriented(split):
        return split if taxa[0] not in split else everyone - split

    frequencies = {oriented(s): float(np.mean(f)) for s, f in split_frequencies(runs, burnin).items()}
    lengths = {oriented(s): length for s, length in mean_split_lengths(runs, burnin).items()}
    kept = sorted((s for s, f in frequencies.items() if f > min_frequency), key=len)
    tips = np.mean(np.concatenate([np.asarray(r.tip_lengths[r.kept(burnin)]) for r in runs]), axis=0)
    members = {everyone: []}
    for split in kept:
        members[split] = []
    for split in kept:  # smallest first: its parent is the smallest larger kept split containing it
        parent = next((other for other in kept if len(other) > len(split) and split < other), everyone)
        members[parent].append(split)

    def text(clade) -> str:
        placed = set().union(*members[clade]) if members[clade] else set()
        parts = [text(child) + (f"{frequencies[child]:.4f}" if labels else "") + f":{lengths[child]:.10g}"
                 for child in members[clade]]
        parts += [f"{quoted(t)}:{tips[taxa.index(t)]:.10g}" for t in taxa[1:] if t in clade and t not in placed]
        return "(" + ",".join(sorted(parts)) + ")"

    return f"({quoted(taxa[0])}:{tips[0]:.10g}," + text(everyone)[1:] + ";"


def tree_newick(parent: np.ndarray, lengths: np.ndarray, taxa, numbered: bool = True) -> str:
    """An unrooted sampled tree in Newick: tips as translate numbers (NEXUS) or as names."""
    tree = TreeBatch(parent[None], lengths[None], tuple(taxa)).to_trees(rooted=False)[0]
    return newick_string(tree.topology, np.asarray(tree.branch_lengths), names=not numbered)


def convergence(runs: list[RunSamples], names: list[str], burnin: float) -> list[dict]:
    """PSRF (Gelman-Rubin across runs) and ESS (pooled) of every scalar column, after burn-in."""
    length = min(len(r.columns[r.kept(burnin)]) for r in runs)
    if length < 4:
        return [{"name": n, "mean": float("nan"), "psrf": float("nan"), "ess": float("nan")} for n in names]
    table = np.stack([np.asarray(r.columns[r.kept(burnin)][-length:]) for r in runs])  # [runs, samples, columns]
    rows = []
    for k, name in enumerate(names):
        x = table[..., k]
        psrf = float(gelman_rubin(x)) if len(runs) > 1 else float("nan")
        rows.append({"name": name, "mean": float(np.mean(x)), "psrf": psrf,
                     "ess": float(effective_sample_size(x))})
    return rows
