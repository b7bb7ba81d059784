"""What a time-tree run's samples become: annotated NEXUS trees, a maximum-clade-credibility tree, a summary.

A clade is the set of tips below a node, held as a bit mask (tip `t` is bit
`t`). The MCC tree is TreeAnnotator's: the sampled tree, after burn-in, whose
clades' posterior frequencies have the greatest product; every node is
annotated with its clade's posterior, the median and 95% HPD interval of its
height over the samples that contain the clade (and of its age, with dates),
and its median rate; branch lengths come from the median heights (as
TreeAnnotator's `-heights median`), clipped at zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpyro.diagnostics import effective_sample_size

from ...io import newick_string
from ._start import height_ordered_tree



@dataclass
class TimeTreeSamples:
    """Every chain's samples on the host: generations, trees (parents, heights, rates) and log columns."""

    names: list
    generations: list = field(default_factory=list)
    trees: list = field(default_factory=list)  # per chain: [(parents, heights, rates), ...]
    columns: list = field(default_factory=list)  # per chain: [values, ...]

    @classmethod
    def empty(cls, chains: int, names: list) -> "TimeTreeSamples":
        return cls(list(names), [], [[] for _ in range(chains)], [[] for _ in range(chains)])

    @property
    def count(self) -> int:
        return len(self.generations)

    def add(self, generation: int, chains) -> None:
        self.generations.append(int(generation))
        for c, (parents, heights, rates, values) in enumerate(chains):
            self.trees[c].append((np.asarray(parents), np.asarray(heights), np.asarray(rates)))
            self.columns[c].append(np.asarray(values, float))

    def column(self, name: str, burnin: float = 0.0) -> np.ndarray:
        """`[chains, draws]` of one log column after burn-in."""
        k = self.names.index(name)
        return np.asarray([[row[k] for row in chain[self._first(burnin):]] for chain in self.columns])

    def kept_trees(self, burnin: float):
        return [tree for chain in self.trees for tree in chain[self._first(burnin):]]

    def _first(self, burnin: float) -> int:
        return int(self.count * burnin)

    def to_plain(self) -> dict:
        stack = lambda k: [np.asarray([tree[k] for tree in chain]) for chain in self.trees]  # noqa: E731
        return {"names": self.names, "generations": list(self.generations), "parents": stack(0), "heights": stack(1),
                "rates": stack(2), "columns": [np.asarray(chain) for chain in self.columns]}

    @classmethod
    def from_plain(cls, plain: dict) -> "TimeTreeSamples":
        trees = [list(zip(p, h, r)) for p, h, r in zip(plain["parents"], plain["heights"], plain["rates"])]
        return cls(list(plain["names"]), list(plain["generations"]), trees, [list(c) for c in plain["columns"]])


def time_tree_newick(parents, heights, rates=None, notes=None) -> str:
    """A rooted time tree in Newick with translate numbers for tips, branch lengths in time (negative ones, from
    median heights, clipped at 0), and `[&height=h,rate=r]` (or `notes[v]`, a dict per node) on every node."""
    parents, heights = np.asarray(parents), np.asarray(heights, float)
    n = (len(parents) + 1) // 2
    tree, order = height_ordered_tree(parents, heights, tuple(map(str, range(n))))

    def note(v) -> str:
        values = notes[v] if notes is not None else {"height": heights[v], **({} if rates is None or parents[v] < 0
                                                                              else {"rate": rates[v]})}
        return "[&" + ",".join(f"{k}={_value(x)}" for k, x in values.items()) + "]"

    texts = [note(v) for v in order]
    lengths = np.maximum(np.asarray(tree.branch_lengths), 0.0)
    return newick_string(tree.topology, lengths, texts, root_note=texts[-1])[:-1]


def _value(x) -> str:
    if isinstance(x, (tuple, list)):
        return "{" + ",".join(f"{float(v):.10g}" for v in x) + "}"
    return f"{float(x):.10g}"


def clade_masks(parents, heights) -> list[int]:
    """Every node's clade as a bit mask over tips (children first: heights increase towards the root)."""
    m = len(parents)
    n = (m + 1) // 2
    masks = [1 << v if v < n else 0 for v in range(m)]
    for node in np.argsort(heights, kind="stable"):
        if parents[node] >= 0:
            masks[parents[node]] |= masks[node]
    return masks


def hpd(values, mass: float = 0.95) -> tuple[float, float]:
    """The shortest interval holding `mass` of the values."""
    x = np.sort(np.asarray(values, float))
    k = max(1, int(math.ceil(mass * len(x))))
    widths = x[k - 1:] - x[: len(x) - k + 1]
    i = int(np.argmin(widths))
    return float(x[i]), float(x[i + k - 1])


def clade_frequencies(trees, masks=None) -> dict[int, float]:
    """Every clade's frequency among `trees` (`masks`: their `clade_masks`, when already at hand)."""
    masks = masks or [clade_masks(p, h) for p, h, _ in trees]
    counts: dict[int, int] = {}
    for tree_masks in masks:
        for mask in tree_masks[(len(tree_masks) + 1) // 2:]:
            counts[mask] = counts.get(mask, 0) + 1
    return {mask: c / len(masks) for mask, c in counts.items()}


def mcc_tree(samples: TimeTreeSamples, taxa, burnin: float = 0.1, reference: float | None = None) -> str:
    """The maximum-clade-credibility tree of the samples after `burnin`, annotated (module docstring)."""
    trees = samples.kept_trees(burnin)
    if not trees:
        raise ValueError("no samples after burn-in")
    masks = [clade_masks(p, h) for p, h, _ in trees]  # once per tree: the loops below are Python
    frequency = clade_frequencies(trees, masks)
    n = len(taxa)
    scores = [sum(math.log(frequency[mask]) for mask in tree_masks[n:]) for tree_masks in masks]
    best_index = int(np.argmax(scores))
    parents, heights, _ = trees[best_index]
    best = masks[best_index]
    wanted = {mask: [] for mask in best}
    for (_, h, r), tree_masks in zip(trees, masks):
        for node, mask in enumerate(tree_masks):
            if mask in wanted:
                wanted[mask].append((h[node], r[node]))
    notes, median_heights = [], np.zeros(len(parents))
    for node, mask in enumerate(best):
        values = np.asarray(wanted[mask])
        median_heights[node] = np.median(values[:, 0])
        note = {"height": median_heights[node], "height_median": median_heights[node],
                "height_95%_HPD": hpd(values[:, 0]), "posterior": frequency.get(mask, 1.0)}
        if reference is not None:
            low, high = note["height_95%_HPD"]
            note.update(age=reference - median_heights[node], age_95_HPD=(reference - high, reference - low))
        if parents[node] >= 0:
            note["rate"] = float(np.median(values[:, 1]))
        notes.append(note)
    return time_tree_newick(parents, median_heights, notes=notes)


def summary_rows(samples: TimeTreeSamples, burnin: float = 0.1) -> list[dict]:
    """Median, mean, 95% HPD and ESS (over chains, NumPyro's estimator) of every log column after burn-in."""
    rows = []
    for name in samples.names:
        values = samples.column(name, burnin)
        if values.shape[1] < 4:
            continue
        low, high = hpd(values.ravel())
        rows.append({"name": name, "median": float(np.median(values)), "mean": float(np.mean(values)),
                     "hpd_95": [low, high], "ess": float(effective_sample_size(values))})
    return rows
