"""Kernel form: binary rooted trees as parent arrays over `M = 2N-1` nodes (tips `0..N-1`, root's parent -1).

Kernels see only this form. `binarize` turns any `Topology` into it (polytomies,
the trifurcating root of an unrooted tree included, resolved by zero-length
branches, which leave the likelihood unchanged); `TreeBatch` stacks trees in it
as device arrays.

Search and sampling moves keep kernel trees rooted on the branch of tip 0.
Then the root's children are tip 0 and one internal node `w` whose branch is
fixed at zero (tip 0's branch carries the whole edge), and every internal
edge of the unrooted tree is the branch above an internal node `v` whose
parent `u` is not the root: NNIs need no special case at the root. On the
host, the same tree is also an *unrooted* adjacency (`neighbours[node] =
{other: length}`), the form in which SPR candidates are built.
"""

from __future__ import annotations

from functools import lru_cache

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from ..runtime import to_device
from ._topology import Topology, Tree, _taxa_count


@lru_cache(maxsize=256)
def binarize(topology: Topology) -> tuple[np.ndarray, np.ndarray]:
    """Kernel parent array of a topology, and per kernel node the user node whose branch it takes (-1: none).

    Cached (topologies are hashable): the schedule and the branch index both start here. Do not modify.
    """
    n = topology.num_tips
    kernel_parent: list[int] = [-1] * n
    user_of: list[int] = list(range(n))
    kernel_of = {t: t for t in range(n)}
    for node in range(n, topology.num_nodes):  # children always precede parents
        kids = [kernel_of[c] for c in topology.children[node]]
        while len(kids) > 2:  # join the last two under a zero-length node
            new = len(kernel_parent)
            kernel_parent.append(-1)
            user_of.append(-1)
            b, c = kids.pop(), kids.pop()
            kernel_parent[b] = kernel_parent[c] = new
            kids.append(new)
        if len(kids) == 1:  # a unifurcation: merge it into its child
            kernel_of[node] = kids[0]
            continue
        new = len(kernel_parent)
        kernel_parent.append(-1)
        user_of.append(node)
        for k in kids:
            kernel_parent[k] = new
        kernel_of[node] = new
    if len(kernel_parent) != max(2 * n - 1, 1):
        raise ValueError("a binarized tree must have 2N-1 nodes")
    return np.asarray(kernel_parent, np.int32), np.asarray(user_of, np.int32)


@lru_cache(maxsize=256)
def branch_index(topology: Topology) -> np.ndarray:
    """Which entry of the user's branch lengths each kernel node (and the sentinel) takes; `num_nodes` means zero."""
    _, user_of = binarize(topology)
    index = np.where(user_of >= 0, user_of, topology.num_nodes)
    return np.append(index, topology.num_nodes).astype(np.int32)


class TreeBatch(eqx.Module):
    """A batch of binary rooted trees over the same taxa, as device arrays ("kernel form").

    `parents[b, k]` is the parent of node `k` of tree `b` (tips `0..N-1` in the
    order of `taxa`, `M = 2N-1` nodes, the root's parent `-1`; internal nodes
    may be numbered in any order, as topology moves leave them), and
    `branch_lengths[b, k]` the length of the branch above `k` (the root's unused).
    Unrooted trees are stored rooted on a branch: for reversible models the
    root position does not change the likelihood, and `to_trees(rooted=False)`
    merges the root away again. Topology and lengths are both data, so the
    likelihood of any batch of the same size runs one compiled program.
    """

    parents: Int[Array, "batch nodes"]
    branch_lengths: Float[Array, "batch nodes"]
    taxa: tuple[str, ...] = eqx.field(static=True)

    @classmethod
    def from_trees(cls, trees: "list[Tree]") -> "TreeBatch":
        """Stack trees over the same taxa (any tip order, polytomies resolved by zero-length branches)."""
        taxa = trees[0].taxa
        position = {t: i for i, t in enumerate(taxa)}
        parents, lengths = [], []
        for tree in trees:
            if set(tree.taxa) != set(taxa) or len(tree.taxa) != len(taxa):
                raise ValueError("every tree of a batch must have the same taxa")
            parent, user_of = binarize(tree.topology)
            n = tree.num_tips
            rename = np.arange(len(parent))
            rename[:n] = [position[t] for t in tree.taxa]
            renamed = np.full(len(parent), -1, np.int32)
            renamed[rename] = np.where(parent >= 0, rename[np.maximum(parent, 0)], -1)
            user_lengths = np.append(np.asarray(tree.branch_lengths, float), 0.0)
            kernel_lengths = np.zeros(len(parent))
            kernel_lengths[rename] = user_lengths[np.where(user_of >= 0, user_of, len(user_lengths) - 1)]
            kernel_lengths[rename[parent < 0]] = 0.0
            parents.append(renamed)
            lengths.append(kernel_lengths)
        return cls(to_device(np.stack(parents)), to_device(np.stack(lengths)), tuple(taxa))

    @property
    def num_tips(self) -> int:
        return len(self.taxa)

    def __len__(self) -> int:
        return self.parents.shape[0]

    def __repr__(self) -> str:
        """A one-line summary, e.g. `TreeBatch(8 trees, 27 taxa)` (also inside `jit`/`vmap`)."""
        shape = getattr(self.parents, "shape", None)
        count = f"{shape[0]} trees" if shape is not None and len(shape) == 2 else f"parents of shape {shape}"
        return f"TreeBatch({count}, {_taxa_count(self.taxa)})"

    def to_trees(self, rooted: bool = False) -> "list[Tree]":
        """Back to `Tree`s (on the host); unrooted (the default) with a trifurcating root again."""
        parents, lengths = np.asarray(self.parents), np.asarray(self.branch_lengths)
        return [_tree_from_kernel(p, l, self.taxa, rooted) for p, l in zip(parents, lengths)]


def _tree_from_kernel(parent: np.ndarray, lengths: np.ndarray, taxa, rooted: bool) -> Tree:
    """A `Tree` (children before parents, root last) from a kernel-form parent array."""
    n = len(taxa)
    parent, lengths = parent.copy(), lengths.astype(float).copy()
    root = int(np.argmin(parent))
    if not rooted and n > 2:  # merge the root into an internal child: the two root branches become one
        kids = [k for k in np.flatnonzero(parent == root)]
        keep = max(kids, key=lambda k: (k >= n, k))  # an internal child if there is one
        other = kids[0] if kids[1] == keep else kids[1]
        parent[other], lengths[other] = keep, lengths[other] + lengths[keep]
        parent[keep], lengths[keep] = -1, 0.0
        parent[root] = -2  # removed
        root = keep
    children: dict[int, list[int]] = {}
    for node, up in enumerate(parent):
        if up >= 0:
            children.setdefault(int(up), []).append(node)
    order, stack = [], [(root, False)]
    while stack:  # iterative post-order
        node, done = stack.pop()
        if done or node < n:
            order.append(node)
            continue
        stack.append((node, True))
        stack.extend((k, False) for k in reversed(children.get(node, [])))
    internal = [k for k in order if k >= n]
    new_id = {k: k for k in range(n)} | {k: n + i for i, k in enumerate(internal)}
    new_parent = [0] * (n + len(internal))
    new_lengths = np.zeros(n + len(internal))
    for node in order:
        up = parent[node]
        new_parent[new_id[node]] = new_id[int(up)] if up >= 0 else -1
        new_lengths[new_id[node]] = lengths[node] if up >= 0 else 0.0
    return Tree(to_device(new_lengths), Topology(tuple(new_parent), tuple(taxa), rooted))


def unrooted(parent: np.ndarray, lengths: np.ndarray) -> tuple[list[dict[int, float]], int]:
    """The unrooted tree of a kernel tree as adjacency dicts (the root merged away), and the root's id.
    Lengths `[M]`, or `[M, K]` (every part's, unlinked): a length is then a `[K]` row."""
    parent, lengths = np.asarray(parent), np.asarray(lengths, float)
    root = int(np.flatnonzero(parent < 0)[0])
    neighbours: list[dict[int, float]] = [dict() for _ in range(len(parent))]
    for node, up in enumerate(parent):
        if up >= 0 and up != root:
            neighbours[node][int(up)] = neighbours[int(up)][node] = lengths[node]
    a, b = (int(k) for k in np.flatnonzero(parent == root))  # the root's two branches are one edge
    neighbours[a][b] = neighbours[b][a] = lengths[a] + lengths[b]
    return neighbours, root


def rooted_on_first_tip(neighbours: list[dict[int, float]], root: int) -> tuple[np.ndarray, np.ndarray]:
    """Kernel `(parent, lengths)` of an unrooted adjacency, rooted on tip 0's branch at node id `root`."""
    m = len(neighbours)
    w = next(iter(neighbours[0]))
    parent, lengths = np.full(m, -1, np.int32), np.zeros((m,) + np.shape(neighbours[0][w]))  # [M] or [M, K]
    parent[0], parent[w], lengths[0] = root, root, neighbours[0][w]
    stack = [(w, 0)]
    while stack:
        node, came_from = stack.pop()
        for other, length in neighbours[node].items():
            if other != came_from:
                parent[other], lengths[other] = node, length
                stack.append((other, node))
    return parent, lengths


def root_on_first_tip(parent: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The same unrooted tree, rooted on tip 0's branch; node ids are kept (the old root stays the root)."""
    return rooted_on_first_tip(*unrooted(parent, lengths))


@jax.jit  # called from the search's host code too: one program, not an operation dispatched at a time
def fixed_branches(parent):
    """Mask of the branches that are not free: the root's (unused) and its internal child's (zero)."""
    root = jnp.argmin(parent, axis=-1)
    node = jnp.arange(parent.shape[-1])
    return (node == root[..., None]) | ((parent == root[..., None]) & (node != 0))


def mask_like(mask, lengths):
    """A per-node mask `[..., M]` broadcastable against lengths `[..., M]` or unlinked ones `[..., M, K]`."""
    return mask.reshape(mask.shape + (1,) * (lengths.ndim - mask.ndim))


def kernel_batch(trees: list[Tree]) -> TreeBatch:
    """Trees as a batch of kernel trees each rooted on tip 0 (the form searches and samplers move)."""
    batch = TreeBatch.from_trees(trees)
    rooted = [root_on_first_tip(p, l) for p, l in zip(np.asarray(batch.parents), np.asarray(batch.branch_lengths))]
    parents = np.stack([p for p, _ in rooted])
    lengths = np.stack([l for _, l in rooted])
    return TreeBatch(to_device(parents), to_device(lengths), batch.taxa)
