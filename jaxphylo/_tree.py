"""Trees: a static topology plus differentiable branch lengths."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int


@dataclass(frozen=True, eq=False)
class Topology:
    """The shape of a tree: `parent[node]`, with tips `0..N-1`, internal nodes after, root last.

    Nodes may have any number of children (an unrooted tree has a trifurcating
    root). `labels` holds internal node labels and `annotations` the `[&...]`
    metadata of each node; neither takes part in equality or hashing, so two
    topologies are equal when their shapes and tip names are.
    """

    parent: tuple[int, ...]
    taxa: tuple[str, ...]
    rooted: bool = True
    labels: tuple[str | None, ...] = field(default=(), repr=False)
    annotations: tuple[tuple[tuple[str, str], ...], ...] = field(default=(), repr=False)

    def __hash__(self):
        return hash((self.parent, self.taxa, self.rooted))

    def __eq__(self, other):
        return isinstance(other, Topology) and (self.parent, self.taxa, self.rooted) == (
            other.parent, other.taxa, other.rooted)

    @property
    def num_tips(self) -> int:
        return len(self.taxa)

    @property
    def num_nodes(self) -> int:
        return len(self.parent)

    def __repr__(self) -> str:
        """A one-line summary, e.g. `Topology(27 taxa, unrooted)`; the parent indices are in `parent`."""
        return f"Topology({_taxa_count(self.taxa)}, {'rooted' if self.rooted else 'unrooted'})"

    @property
    def root(self) -> int:
        return self.num_nodes - 1

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        kids: list[list[int]] = [[] for _ in self.parent]
        for node, up in enumerate(self.parent):
            if up >= 0:
                kids[up].append(node)
        return tuple(tuple(k) for k in kids)

    @cached_property
    def parent_array(self) -> np.ndarray:
        return np.asarray(self.parent, np.int32)


class Tree(eqx.Module):
    """A phylogeny whose only float leaf is `branch_lengths`, indexed by the child node.

    The root's entry is unused (kept at zero) so that node `k`'s branch is
    `branch_lengths[k]` for every `k`.
    """

    branch_lengths: Float[Array, " nodes"]
    topology: Topology = eqx.field(static=True)

    @property
    def taxa(self) -> tuple[str, ...]:
        return self.topology.taxa

    @property
    def num_tips(self) -> int:
        return self.topology.num_tips

    def with_branch_lengths(self, branch_lengths) -> "Tree":
        return Tree(jnp.asarray(branch_lengths), self.topology)

    @property
    def tree_length(self):
        return jnp.sum(self.branch_lengths)

    def __repr__(self) -> str:
        """A one-line summary, e.g. `Tree(27 taxa, unrooted, length 1.234)` (length = sum of branch lengths).

        Safe inside `jit`/`vmap`: a traced or batched `branch_lengths` is shown by its
        shape instead of a value, and nothing is computed on the device then.
        """
        rooting = "rooted" if self.topology.rooted else "unrooted"
        return f"Tree({_taxa_count(self.topology.taxa)}, {rooting}, {_length_summary(self.branch_lengths)})"


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
        from ._schedule import binarize  # the schedule module sits above this one

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
        return cls(jnp.asarray(np.stack(parents)), jnp.asarray(np.stack(lengths)), tuple(taxa))

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


def _taxa_count(taxa: tuple[str, ...]) -> str:
    return f"{len(taxa)} tax{'on' if len(taxa) == 1 else 'a'}"


def _length_summary(lengths) -> str:
    """`length L` for concrete lengths `[nodes]` (L = their sum), else what they are: traced, batched, abstract."""
    if isinstance(lengths, jax.core.Tracer):
        return f"traced lengths of shape {tuple(lengths.shape)}"
    if not isinstance(lengths, (np.ndarray, jax.Array)):
        return f"lengths {getattr(lengths, 'shape', type(lengths).__name__)}"
    if lengths.ndim != 1:
        return f"lengths of shape {tuple(lengths.shape)}"
    return f"length {float(np.sum(np.asarray(lengths))):.6g}"


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
    return Tree(jnp.asarray(new_lengths), Topology(tuple(new_parent), tuple(taxa), rooted))
