"""The tip-0 view of an unrooted tree: the kernel tree hung from tip 0, the form MCMC moves edit.

A kernel tree (`parents [M]`, binary, rooted) whose root `R` has two children, tip 0 and an internal node `w`
whose branch is fixed at zero, carries the edge between tip 0 and `w` on tip 0's branch. Its tip-0 view is the
unrooted tree hung from tip 0: `up[v]` the neighbour of `v` towards tip 0 (`up[w] = 0`, `up[0] = up[R] = -1`)
and `edge[v]` the length of the edge between `v` and `up[v]` (`edge[w]` is tip 0's kernel branch). Every node
but 0 and `R` then owns exactly one edge: the 2N - 3 edges of the unrooted tree. Node ids are those of the
kernel tree, so a move that edits `up` edits the same nodes' kernel parents.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jaxtyping import Array, Float, Int


def to_view(parents: Int[Array, "M"], lengths: Float[Array, "M"]):
    """Kernel tree -> tip-0 view `(up, edge)`; the root `R` keeps its id and is marked -1."""
    root = jnp.argmin(parents)
    w = jnp.argmax((parents == root) & (jnp.arange(parents.shape[0]) != 0))
    up = parents.at[w].set(0).at[0].set(-1).at[root].set(-1)
    edge = lengths.at[w].set(lengths[0]).at[0].set(0.0).at[root].set(0.0)
    return up, edge


def from_view(up: Int[Array, "M"], edge: Float[Array, "M"], root: Int[Array, ""]):
    """Tip-0 view -> kernel tree rooted on tip 0's edge at node `root`."""
    w = jnp.argmax(up == 0)
    parents = up.at[w].set(root).at[0].set(root).at[root].set(-1)
    lengths = edge.at[0].set(edge[w]).at[w].set(0.0).at[root].set(0.0)
    return parents, lengths


def node_children(up: Int[Array, "M"]) -> Int[Array, "M 2"]:
    """The (at most two) children of every node in the view, -1 where absent (tips; tip 0 has one)."""
    m = up.shape[0]
    node = jnp.arange(m)
    slot = jnp.where(up >= 0, up, m)  # parentless nodes write nowhere
    first = jnp.full(m, m, up.dtype).at[slot].min(node.astype(up.dtype), mode="drop")
    second = jnp.full(m, -1, up.dtype).at[slot].max(node.astype(up.dtype), mode="drop")
    first = jnp.where(first == m, -1, first)
    return jnp.stack([first, jnp.where(second == first, -1, second)], axis=-1)


def sibling(up: Int[Array, "M"], kids: Int[Array, "M 2"], v) -> Int[Array, ""]:
    pair = kids[up[v]]
    return jnp.where(pair[0] == v, pair[1], pair[0])


def neighbours(up: Int[Array, "M"]) -> Int[Array, "M 3"]:
    """Every node's neighbours in the unrooted tree (its view parent and children), -1 where absent."""
    return jnp.concatenate([up[:, None], node_children(up)], axis=1)



def descendants(up: Int[Array, "M"], node) -> Array:
    """Mask of `node` and every node below it in the view.

    Pointer doubling: after round `k`, `hit[v]` says whether `node` is among
    the first `2^k` of `v`'s ancestors (itself included) and `jump[v]` is
    `v`'s `2^k`-th ancestor; `ceil(log2 M)` rounds, unrolled (no loop on the
    device, whose every iteration would cost a launch and a host round trip).
    """
    m = up.shape[0]
    hit = jnp.arange(m) == node
    jump = up
    for _ in range(max(1, math.ceil(math.log2(m)))):
        valid = jump >= 0
        safe = jnp.maximum(jump, 0)
        hit = hit | (valid & hit[safe])
        jump = jnp.where(valid, jump[safe], -1)
    return hit
