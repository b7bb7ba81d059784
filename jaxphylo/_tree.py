"""Trees: a static topology plus differentiable branch lengths."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import equinox as eqx
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
