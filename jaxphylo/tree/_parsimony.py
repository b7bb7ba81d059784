"""Fitch parsimony and randomised stepwise-addition parsimony trees (IQ-TREE's and RAxML's start trees).

State sets are bit masks, packed into `W = ceil(S / 32)` words per pattern
(`[patterns, W]` uint32); Fitch's rule joins two sets by intersection where it
is not empty, else by union at the cost of one change (times the pattern
weight). Stepwise addition adds taxa in a random order, each on the edge where
it costs least, ties broken at random. The tree grown so far is rooted at the
first taxon `r`; with `D` a node's down-pass set (its subtree) and `U` its
up-pass set (everything else: `U = fitch(U_parent, D_sibling)`, the set of `r`
below `r`), the set on the edge above a node is `E = fitch(D, U)`. Fitch's
length does not depend on where the tree is rooted, so rooting it at a new
node on that edge shows that attaching taxon `t` there adds exactly the weight
of the patterns where `t`'s set misses `E`: every edge's cost is one array
operation, and the length of every tree is known as it grows.

`parsimony_trees` grows a batch of trees at once (vmapped over random addition
orders, jitted): per addition, one post-order pass for `D` and one pre-order
pass for `U` over the nodes placed so far (a parents-first node order is kept
as data: the new node and the new taxon go in just before the node they sit
above), then the cost of every edge at once. A tree costs O(N^2 P) word
operations.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, UInt32

from ..data import Alignment
from ..runtime import to_device
from ._kernel_form import TreeBatch, rooted_on_first_tip
from ._topology import Tree


def _fitch(a, b):
    """The joined set of two packed state sets `[..., P, W]`, and the patterns where joining cost a change."""
    both = a & b
    empty = jnp.all(both == 0, axis=-1)
    return jnp.where(empty[..., None], a | b, both), empty


def packed_tip_sets(alignment: Alignment) -> tuple[UInt32[np.ndarray, "N P W"], np.ndarray]:
    """Every taxon's state set at every site pattern as bit masks `[N, P, W]`, and the pattern weights."""
    patterns = alignment.site_patterns()
    sets = patterns.tip_table[patterns.codes].astype(bool)  # [N, P, S]
    states = sets.shape[-1]
    words = -(-states // 32)
    bits = np.zeros((states, words), np.uint64)
    bits[np.arange(states), np.arange(states) // 32] = np.left_shift(1, np.arange(states) % 32)
    packed = (sets[..., :, None].astype(np.uint64) * bits).sum(axis=-2)
    return packed.astype(np.uint32), np.asarray(patterns.weights, float)


@jax.jit
def _grow(tips: UInt32[Array, "N P W"], weights, keys) -> tuple[Int[Array, "B M"], Array]:
    """Stepwise addition for each key: parents `[B, 2N - 1]` (rooted at the first taxon, node `2N - 2` unused)
    and the Fitch length of each tree."""
    n = tips.shape[0]
    m = 2 * n - 1
    node = jnp.arange(m, dtype=jnp.int32)

    def one(key):
        k_order, k_ties = jax.random.split(key)
        order = jax.random.permutation(k_order, n).astype(jnp.int32)
        r, first = order[0], order[1]
        parent = jnp.full(m, -1, jnp.int32).at[first].set(r)
        kids = jnp.full((m, 2), m - 1, jnp.int32)  # unused rows point at the unused node
        sequence = jnp.full(m, m - 1, jnp.int32).at[0].set(r).at[1].set(first)  # parents before children
        down = jnp.zeros((m,) + tips.shape[1:], tips.dtype).at[:n].set(tips)
        up = jnp.zeros_like(down)
        length = weights @ _fitch(tips[r], tips[first])[1]
        placed = jnp.zeros(m, bool).at[r].set(True).at[first].set(True)

        def add(i, state):
            parent, kids, sequence, down, up, length, placed = state
            count = 2 * i + 2  # nodes placed: i + 2 taxa, i internal nodes
            t, new = order[i + 2], (n + i).astype(jnp.int32)

            def down_step(j, down):
                x = sequence[count - 1 - j]
                joined = _fitch(down[kids[x, 0]], down[kids[x, 1]])[0]
                return down.at[x].set(jnp.where(x >= n, joined, down[x]))

            def up_step(j, up):
                x = sequence[j]
                p = parent[x]
                sibling = jnp.where(kids[p, 0] == x, kids[p, 1], kids[p, 0])
                above = jnp.where(p == r, tips[r], _fitch(up[p], down[sibling])[0])
                return up.at[x].set(above)

            down = jax.lax.fori_loop(0, count, down_step, down)
            up = jax.lax.fori_loop(1, count, up_step, up)
            edge = _fitch(down, up)[0]  # [M, P, W]
            misses = jnp.all((edge & tips[t][None]) == 0, axis=-1)
            cost = misses.astype(weights.dtype) @ weights
            usable = placed & (node != r)
            best = jnp.min(jnp.where(usable, cost, jnp.inf))
            draw = jax.random.uniform(jax.random.fold_in(k_ties, i), (m,))
            below = jnp.argmax(jnp.where(usable & (cost == best), draw, -1.0)).astype(jnp.int32)
            above = parent[below]
            parent = parent.at[new].set(above).at[below].set(new).at[t].set(new)
            kids = kids.at[above].set(jnp.where(kids[above] == below, new, kids[above])).at[new].set(
                jnp.stack([below, t]))
            at = jnp.argmax(sequence == below)
            shifted = sequence[jnp.maximum(node - 2, 0)]
            sequence = jnp.where(node < at, sequence, jnp.where(node == at, new, jnp.where(node == at + 1, t, shifted)))
            placed = placed.at[new].set(True).at[t].set(True)
            return parent, kids, sequence, down, up, length + best, placed

        state = (parent, kids, sequence, down, up, length, placed)
        parent, *_, length, _ = jax.lax.fori_loop(0, n - 2, add, state)
        return parent, length

    return jax.vmap(one)(keys)


def parsimony_trees(alignment: Alignment, count: int, seed: int = 0, branch_length: float = 0.05
                    ) -> tuple[TreeBatch, np.ndarray]:
    """`count` randomised stepwise-addition parsimony trees, grown together on the device, in kernel form
    (rooted on tip 0, every branch `branch_length`), and the Fitch length of each."""
    n = len(alignment.taxa)
    tips, weights = packed_tip_sets(alignment)
    keys = jax.random.split(jax.random.PRNGKey(seed), count)
    grown, lengths = (np.asarray(x) for x in _grow(to_device(tips), to_device(weights), keys))
    parents, branch_lengths = [], []
    for parent in grown:
        adjacency = [dict() for _ in range(2 * n - 1)]
        for x, p in enumerate(parent):
            if p >= 0:
                adjacency[x][int(p)] = adjacency[int(p)][x] = branch_length
        p, l = rooted_on_first_tip(adjacency, 2 * n - 2)
        parents.append(p)
        branch_lengths.append(l)
    batch = TreeBatch(to_device(np.stack(parents)), to_device(np.stack(branch_lengths)), tuple(alignment.taxa))
    return batch, lengths


def parsimony_tree(alignment: Alignment, seed: int = 0, branch_length: float = 0.05) -> Tree:
    """One stepwise-addition parsimony tree (random addition order from `seed`), unrooted, equal branch lengths."""
    return parsimony_trees(alignment, 1, seed, branch_length)[0].to_trees(rooted=False)[0]


def _fitch_sets(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fitch's rule on boolean state sets `[P, S]` (the reference score: no packing)."""
    both = a & b
    empty = ~both.any(axis=-1)
    return np.where(empty[..., None], a | b, both), empty


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
            current, changed = _fitch_sets(current, sets[k])
            total += changed
        sets[node] = current
    return float(patterns.weights @ total)
