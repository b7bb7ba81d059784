"""Splits (bipartitions of the taxa) of unrooted trees: Robinson-Foulds distances and support labels."""

from __future__ import annotations

import numpy as np

from ._topology import Topology, Tree


def splits(tree: Tree) -> dict[frozenset, int]:
    """Non-trivial splits of an unrooted tree, each mapped to the node whose branch it is."""
    topology, taxa = tree.topology, tree.taxa
    below: list[set] = [{taxa[k]} if k < topology.num_tips else set() for k in range(topology.num_nodes)]
    for node, up in enumerate(topology.parent):  # children precede parents
        if up >= 0:
            below[up] |= below[node]
    everything, out, reference = set(taxa), {}, min(taxa)
    for node in range(topology.num_tips, topology.num_nodes):
        side = below[node] if reference not in below[node] else everything - below[node]
        if 1 < len(side) < len(taxa) - 1:
            out[frozenset(side)] = node
    return out


def robinson_foulds(a: Tree, b: Tree) -> int:
    """The number of non-trivial splits in one tree but not the other."""
    return len(set(splits(a)) ^ set(splits(b)))


def with_supports(tree: Tree, supports: dict[frozenset, float]) -> Tree:
    """`tree` with its internal branches labelled by support (rounded percentages); other labels dropped."""
    labels = [None] * tree.topology.num_nodes
    for split, node in splits(tree).items():
        if split in supports:
            labels[node] = f"{supports[split]:.0f}"
    topology = Topology(tree.topology.parent, tree.taxa, tree.topology.rooted, tuple(labels))
    return Tree(tree.branch_lengths, topology)


def combine_labels(tree: Tree, *labelled: Tree, separator: str = "/") -> Tree:
    """One tree whose internal labels join those of several labelled copies (IQ-TREE writes `alrt/bootstrap`)."""
    parts = [t.topology.labels for t in labelled]
    labels = tuple(separator.join(p[k] for p in parts if p[k] is not None) or None for k in range(tree.topology.num_nodes))
    return Tree(tree.branch_lengths, Topology(tree.topology.parent, tree.taxa, tree.topology.rooted, labels))


def kernel_splits(parent: np.ndarray, taxa) -> list[frozenset | None]:
    """The split of the branch above every node of a kernel tree (None for trivial ones)."""
    n, m = len(taxa), len(parent)
    below: list[set] = [{taxa[k]} if k < n else set() for k in range(m)]
    depth = np.zeros(m, int)
    for k in range(m):
        node = k
        while parent[node] >= 0:
            node, depth[k] = parent[node], depth[k] + 1
    for node in sorted(range(m), key=lambda k: -depth[k]):
        if parent[node] >= 0:
            below[parent[node]] |= below[node]
    everything, reference = set(taxa), min(taxa)
    out = []
    for k in range(m):
        side = below[k] if reference not in below[k] else everything - below[k]
        out.append(frozenset(side) if 1 < len(side) < n - 1 else None)
    return out
