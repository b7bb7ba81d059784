"""Fitch parsimony and randomised stepwise-addition parsimony trees (IQ-TREE's and RAxML's start trees).

State sets are boolean `[patterns, states]` arrays; Fitch's rule joins two
sets by intersection where it is not empty, else by union at the cost of one
change (times the pattern weight). Stepwise addition adds taxa in random
order, each on the edge where it costs least: with `D` a node's down-pass set
(its subtree) and `U` its up-pass set (everything else), the set on the edge
above a node is `fitch(D, U)`, and attaching taxon `t` there costs the weight
of the patterns where `t`'s set misses it. Each addition is O(N) array
operations, a tree O(N^2).
"""

from __future__ import annotations

import numpy as np

from ..runtime import to_device
from ..data import Alignment
from ._kernel_form import TreeBatch, rooted_on_first_tip
from ._topology import Tree


def _fitch(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The joined set and the patterns where it cost a change."""
    both = a & b
    empty = ~both.any(axis=-1)
    return np.where(empty[..., None], a | b, both), empty


def parsimony_tree(alignment: Alignment, seed: int = 0, branch_length: float = 0.05) -> Tree:
    """A stepwise-addition parsimony tree (random addition order from `seed`), unrooted, equal branch lengths."""
    patterns = alignment.site_patterns()
    tips = patterns.tip_table[patterns.codes].astype(bool)  # [N, P, S]
    weights = patterns.weights
    n = len(alignment.taxa)
    order = np.random.default_rng(seed).permutation(n)
    neighbours: list[set[int]] = [set() for _ in range(2 * n - 1)]
    first_internal = n
    a, b, c = order[:3]
    for tip in (a, b, c):
        neighbours[tip].add(first_internal)
        neighbours[first_internal].add(tip)
    next_internal = n + 1
    rng = np.random.default_rng(seed + 1)
    for t in order[3:]:
        parent, post_order = _rooted_at(neighbours, int(order[0]))
        down = {}
        for node in post_order:
            kids = [k for k in neighbours[node] if k != parent[node]]
            down[node] = tips[node] if node < n else _fitch(down[kids[0]], down[kids[1]])[0]
        up, cost = {}, {}
        for node in reversed(post_order):  # parents before children
            p = parent[node]
            if p < 0:
                continue
            if p == order[0]:
                up[node] = tips[p]
            else:
                sibling = next(k for k in neighbours[p] if k not in (node, parent[p]))
                up[node] = _fitch(up[p], down[sibling])[0]
            edge = _fitch(down[node], up[node])[0]
            cost[node] = float(weights @ ~(tips[t] & edge).any(axis=-1))
        best = min(cost.values())
        below = rng.choice([k for k, v in cost.items() if v == best])
        above = parent[below]
        new = next_internal
        next_internal += 1
        neighbours[below].discard(above)
        neighbours[above].discard(below)
        for k in (below, above, t):
            neighbours[new].add(k)
            neighbours[k].add(new)
    return _as_tree(neighbours, alignment.taxa, branch_length)


def _rooted_at(neighbours, root):
    """Parents (`-1` at `root`) and a post-order of the tree grown so far, rooted at a leaf."""
    parent = {root: -1}
    order, stack = [], [root]
    while stack:
        node = stack.pop()
        order.append(node)
        for k in neighbours[node]:
            if k not in parent:
                parent[k] = node
                stack.append(k)
    return parent, order[::-1]


def _as_tree(neighbours, taxa, branch_length) -> Tree:
    adjacency = [{k: branch_length for k in around} for around in neighbours]
    parent, lengths = rooted_on_first_tip(adjacency, len(neighbours) - 1)
    return TreeBatch(to_device(parent[None]), to_device(lengths[None]), tuple(taxa)).to_trees(rooted=False)[0]


def parsimony_score(alignment: Alignment, tree: Tree) -> float:
    """Fitch parsimony length of `tree` (any rooting; polytomies joined pairwise)."""
    patterns = alignment.site_patterns()
    row = {name: i for i, name in enumerate(alignment.taxa)}
    topology = tree.topology
    sets: list = [patterns.tip_table[patterns.codes[row[t]]].astype(bool) for t in topology.taxa]
    sets += [None] * (topology.num_nodes - topology.num_tips)
    total = np.zeros(patterns.num_patterns)
    for node in range(topology.num_tips, topology.num_nodes):  # children precede parents
        kids = topology.children[node]
        current = sets[kids[0]]
        for k in kids[1:]:
            current, changed = _fitch(current, sets[k])
            total += changed
        sets[node] = current
    return float(patterns.weights @ total)
