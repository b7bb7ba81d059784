"""Incremental likelihoods for samplers: keep every chain's partials, recompute only what a move touched.

A batch of `B` chains of kernel trees (`parents [B, M]`, `lengths [B, M]`,
node ids stable across moves) keeps, per chain, the rescaled partials and log
scale factors of every internal node by node id, double buffered
(`NodePartials`; BEAGLE's and MrBayes's flip of a per-node buffer index). A
proposal edits a few parent entries (NNI, SPR, ...) or lengths; node `v`'s
partials depend only on its children's partials and on their edges' `P`, so
the nodes to recompute (the *dirty set*) are, in the proposed tree, the
ancestors-or-self of the old and new parents of every *changed* node (one
whose parent or length differs). The dirty set is found on the device by
diffing the arrays (`dirty_nodes`: an ancestor closure by pointer doubling,
`ceil(log2 M)` rounds), ordered deepest first (children before parents) into
an operation list per chain, and recomputed into each dirty node's *other*
buffer (`kernels.update_partials`: the C++ kernel on a CPU, one Pallas
launch walking every chain's list on a GPU, or one Pallas launch per dirty
level, all doing no work for clean nodes; else an XLA loop over the longest
list).
The proposal is the state with those rows written and `current` switched to
the proposal's rows; `accept_partials` keeps the proposal's index for
accepted chains and the old one for the others: no partials are copied, and
a rejected chain's valid rows are untouched. Under `jit` the buffers are a
loop carry (or donated), so the rows are written in place.

`P` is computed afresh for every edge of every proposal (one eigensystem and
`M` small matrix exponentials per chain: for 4 states far below one node's
partials), so it is not kept; a chain whose model changed (a model
parameter, the tree scale, HMC) is marked in `every_node` and recomputes all
its nodes. A `PartitionedModel` is not handled here: samplers with one fall
back to the full recomputation (`batch_pattern_log_likelihoods`).
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from ..models import Model
from ..tree import kernel_children
from . import kernels
from ._arrays import PatternData, model_arrays


class NodePartials(eqx.Module):
    """Per chain, the rescaled partials of every internal node and the sum of the log scale factors of its
    subtree (the root's: the total), by node id, twice.

    Row `[b, k, v - N]` is buffer `k` of internal node `v` of chain `b`; `current[b, v - N]` says which
    buffer holds the kept tree's (for a proposal returned by `proposed_partials`: the proposal's).
    `computed[b]`: how many nodes the call that made this state recomputed for chain `b`.
    """

    partials: Float[Array, "B 2 I C patterns S"]
    log_scales: Float[Array, "B 2 I patterns"]
    current: Int[Array, "B I"]  # int8: 0 or 1
    computed: Int[Array, " B"]


def node_depths(parents: Int[Array, "B M"]) -> Int[Array, "B M"]:
    """Number of ancestors of every node (the root 0), by pointer doubling."""
    m = parents.shape[1]

    def one(parent):
        depth, jump = (parent >= 0).astype(jnp.int32), parent
        for _ in range(max(1, math.ceil(math.log2(m)))):
            valid = jump >= 0
            depth = depth + jnp.where(valid, depth[jnp.maximum(jump, 0)], 0)
            jump = jnp.where(valid, jump[jnp.maximum(jump, 0)], -1)
        return depth

    return jax.vmap(one)(parents)


def dirty_nodes(parents: Int[Array, "B M"], lengths: Float[Array, "B M"], old_parents: Int[Array, "B M"],
                old_lengths: Float[Array, "B M"], every_node: Bool[Array, " B"] | None = None) -> Bool[Array, "B M"]:
    """The nodes whose partials a proposal changes: in the proposed tree, the ancestors-or-self of the old and
    new parents of every node whose parent or length changed (every internal node where `every_node`)."""
    b, m = parents.shape
    num_tips = (m + 1) // 2
    changed = (parents != old_parents) | (lengths != old_lengths)

    def one(parent, old_parent, changed):
        seeds = jnp.zeros(m + 1, bool)
        seeds = seeds.at[jnp.where(changed & (parent >= 0), parent, m)].set(True)
        seeds = seeds.at[jnp.where(changed & (old_parent >= 0), old_parent, m)].set(True)
        # After round k every node is marked that has a seed within 2^k generations below it (or is one).
        mark, jump = seeds[:m], parent
        for _ in range(max(1, math.ceil(math.log2(m)))):
            mark = mark.at[jnp.where(jump >= 0, jump, m)].max(mark, mode="drop")
            jump = jnp.where(jump >= 0, jump[jnp.maximum(jump, 0)], -1)
        return mark

    dirty = jax.vmap(one)(parents, old_parents, changed)
    if every_node is not None:
        dirty = dirty | every_node[:, None]
    return dirty & (jnp.arange(m) >= num_tips)


def operation_lists(parents: Int[Array, "B M"], dirty: Bool[Array, "B M"]):
    """`(operations [B, N - 1], counts [B], depths [B, N - 1])`: each chain's dirty nodes deepest first (children
    before parents), padded after `counts[b]` with clean internal nodes (whose results go to their unused
    buffer), and each listed node's number of ancestors."""
    m = parents.shape[1]
    num_tips = (m + 1) // 2
    depth = node_depths(parents)
    key = jnp.where(dirty, -depth, jnp.where(jnp.arange(m) >= num_tips, m, m + 1))
    operations = jnp.argsort(key, axis=1, stable=True)[:, : (m - 1) // 2].astype(jnp.int32)
    return operations, jnp.sum(dirty, axis=1).astype(jnp.int32), jnp.take_along_axis(depth, operations, axis=1)


def _kernel_inputs(model: Model, parents, lengths, data: PatternData, dtype, per_tree_models: bool):
    transition, pi, w = model_arrays(model, lengths, dtype, per_tree_models)
    children = jax.vmap(kernel_children)(parents).astype(jnp.int32)
    root = jnp.argmin(parents, axis=1).astype(jnp.int32)
    return transition, pi, w, children, root, jnp.asarray(data.tip_codes), jnp.asarray(data.tip_table, dtype)


def _update(model, parents, lengths, data, dtype, per_tree_models, partials, log_scales, buffer, dirty):
    transition, pi, w, children, root, codes, table = _kernel_inputs(model, parents, lengths, data, dtype,
                                                                     per_tree_models)
    operations, counts, depths = operation_lists(parents, dirty)
    partials, log_scales, per_pattern = kernels.update_partials(
        transition, codes, table, partials, log_scales, buffer.astype(jnp.int32), children, operations, counts,
        depths, root, pi, w)
    return NodePartials(partials, log_scales, buffer.astype(jnp.int8), counts), per_pattern


@eqx.filter_jit  # called eagerly when a sampler starts: one program, not an op-by-op loop compiled per call
def full_partials(model: Model, parents: Int[Array, "B M"], lengths: Float[Array, "B M"], data: PatternData,
                  dtype, per_tree_models: bool = False) -> tuple[NodePartials, Float[Array, "B patterns"]]:
    """Every internal node's partials (buffer 0 current) and `log L_c [B, patterns]`: a chain's first state.

    With `per_tree_models` every leaf of `model` has a leading `[B]` axis (as
    `batch_pattern_log_likelihoods`). Buffer 1 starts as zeros.
    """
    b, m = parents.shape
    num_tips = (m + 1) // 2
    transition = jax.eval_shape(lambda: model_arrays(model, lengths, dtype, per_tree_models)[0])
    categories, (patterns, states) = transition.shape[2], (data.tip_codes.shape[1], data.tip_table.shape[1])
    partials = jnp.zeros((b, 2, num_tips - 1, categories, patterns, states), dtype)
    log_scales = jnp.zeros((b, 2, num_tips - 1, patterns), dtype)
    buffer = jnp.zeros((b, num_tips - 1), jnp.int32)
    dirty = jnp.broadcast_to(jnp.arange(m) >= num_tips, (b, m))
    return _update(model, parents, lengths, data, dtype, per_tree_models, partials, log_scales, buffer, dirty)


def proposed_partials(state: NodePartials, model: Model, parents: Int[Array, "B M"], lengths: Float[Array, "B M"],
                      old_parents: Int[Array, "B M"], old_lengths: Float[Array, "B M"], data: PatternData, dtype,
                      per_tree_models: bool = False, every_node: Bool[Array, " B"] | None = None,
                      ) -> tuple[NodePartials, Float[Array, "B patterns"]]:
    """The proposal's partials and `log L_c [B, patterns]`, recomputing only its dirty nodes (`dirty_nodes`).

    `state` holds the partials of `(old_parents, old_lengths)`; every dirty node
    is written into its non-current buffer, and the returned state's `current`
    points at the proposal's rows (pass it to `accept_partials`). `every_node
    [B]` marks chains whose `P` all changed (their model: then every node).
    """
    internal = state.current.shape[1]
    num_tips = internal + 1
    dirty = dirty_nodes(parents, lengths, old_parents, old_lengths, every_node)
    buffer = jnp.where(dirty[:, num_tips:], 1 - state.current, state.current)
    return _update(model, parents, lengths, data, dtype, per_tree_models, state.partials, state.log_scales, buffer,
                   dirty)


def accept_partials(state: NodePartials, proposal: NodePartials, accept: Bool[Array, " B"]) -> NodePartials:
    """The kept state: the proposal's rows for accepted chains, the old ones for the rest (an index flip)."""
    current = jnp.where(accept[:, None], proposal.current, state.current)
    return NodePartials(proposal.partials, proposal.log_scales, current, proposal.computed)
