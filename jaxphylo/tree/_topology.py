"""Trees: a static topology plus differentiable branch lengths."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float


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


def random_topology_tree(taxa, seed: int = 0, mean_branch_length: float = 0.1) -> Tree:
    """A random rooted binary tree (random joining of lineages) with exponential branch lengths."""
    rng = np.random.default_rng(seed)
    n = len(taxa)
    parent = np.full(2 * n - 1, -1)
    active = list(range(n))
    for node in range(n, 2 * n - 1):
        i, j = rng.choice(len(active), size=2, replace=False)
        a, b = active[i], active[j]
        parent[a] = parent[b] = node
        for k in sorted((i, j), reverse=True):
            active.pop(k)
        active.append(node)
    lengths = rng.exponential(mean_branch_length, 2 * n - 1)
    lengths[-1] = 0.0
    return Tree(jnp.asarray(lengths), Topology(tuple(int(p) for p in parent), tuple(taxa), True))
