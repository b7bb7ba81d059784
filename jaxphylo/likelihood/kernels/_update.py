"""Incremental post-order: recompute only the nodes of an operation list, in place, by node id (XLA).

The partials a sampler keeps between generations are indexed by *node id*
(not by schedule slot, which moves when the topology does) and double
buffered, as BEAGLE's and MrBayes's are: row `[b, k, v - N]` of
`partials [B, 2, M - N, C, P, S]` and `log_scales [B, 2, M - N, P]` is buffer
`k` of internal node `v` of chain `b` (`log_scales`: the sum of the log scale
factors of every internal node of `v`'s subtree, so that a node's row
changes exactly when its partials do, and the root's is the total), and `buffer [B, M - N]` says which of
the two holds the tree being evaluated. An operation list `operations [B, Q]`
(internal node ids, children before parents, `counts [B]` of them real)
names the nodes to recompute; each is written into its `buffer` row, its
children read from theirs (a child not in the list keeps the row it had).
A node's step is the level passes' (`_xla`): `p_v = (P_a p_a) * (P_b p_b)`,
rescaled per pattern, but by the power of two `2^e` with the maximum over
categories and states `m = f 2^e`, `f` in `[1/2, 1)` (`rescale_by_power_of_two`:
exact, no division, and in C++ no log per node and pattern: `e log 2`); that
log plus the children's subtree sums is the node's `log_scales` row.
Then `log L_c = log(sum_r w_r pi^T p_root,r,c) + log_scales_root,c`.

`update_partials` is the XLA version: one loop iteration per position of the
longest list in the batch, each chain computing its own node of that
position (past a chain's count its list holds clean nodes, written into their
unused buffer). The C++ kernel (`_cpu.update_partials`) walks the
same lists and does no work for positions past a chain's count.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float, Int

from ...runtime import set_per_tree, take_per_tree
from ._xla import apply_transition, root_sum


def update_partials(
    transition: Float[Array, "B M C S S"],
    tip_codes: Int[Array, "tips_plus_one patterns"],
    tip_table: Float[Array, "codes S"],
    partials: Float[Array, "B 2 I C patterns S"],
    log_scales: Float[Array, "B 2 I patterns"],
    buffer: Int[Array, "B I"],
    children: Int[Array, "B M 2"],
    operations: Int[Array, "B Q"],
    counts: Int[Array, " B"],
    root: Int[Array, " B"],
    root_frequencies: Float[Array, "B S"],
    category_weights: Float[Array, "B C"],
) -> tuple[Float[Array, "B 2 I C patterns S"], Float[Array, "B 2 I patterns"], Float[Array, "B patterns"]]:
    """Recompute the listed nodes into their `buffer` rows; `(partials, log_scales, log L_c [B, patterns])`."""
    num_tips = tip_codes.shape[0] - 1

    def node(i, carry):
        partials, log_scales = carry
        v = operations[:, i]
        kids = take_per_tree(children, v)  # [B, 2]
        is_tip = kids < num_tips
        rows = jnp.where(is_tip, 0, kids - num_tips)
        which = take_per_tree(buffer, rows)
        inner = take_per_tree(partials, (which, rows))  # [B, 2, C, P, S]
        tips = tip_table[tip_codes[jnp.where(is_tip, kids, num_tips)]][:, :, None]  # [B, 2, 1, P, S]
        x = jnp.where(is_tip[..., None, None, None], tips, inner)
        messages = apply_transition(take_per_tree(transition, kids), x)
        p, log_scale = rescale_by_power_of_two(messages[:, 0] * messages[:, 1])
        below = take_per_tree(log_scales, (which, rows))  # [B, 2, P]: the children's subtree sums
        log_scale = log_scale + jnp.sum(jnp.where(is_tip[..., None], 0.0, below), axis=1)
        # Past a chain's count its list holds clean nodes: write into their other buffer, which this
        # proposal never reads (no scatter with dropped rows, which a CPU runs element by element).
        row = v - num_tips
        current = take_per_tree(buffer, row)
        to = jnp.where(i < counts, current, 1 - current)
        return set_per_tree(partials, (to, row), p), set_per_tree(log_scales, (to, row), log_scale)

    partials, log_scales = lax.fori_loop(0, jnp.max(counts), node, (partials, log_scales))
    return partials, log_scales, kept_log_likelihoods(partials, log_scales, buffer, root, root_frequencies,
                                                      category_weights, num_tips)


def level_schedule(counts: Int[Array, " B"], depths: Int[Array, "B Q"], width: int
                   ) -> tuple[Int[Array, "B Q"], Int[Array, "B Q"], Int[Array, ""]]:
    """The operation lists as launches of independent nodes: `(launch [B, Q], slot [B, Q], launches)`.

    Launch `l` holds, for every chain, up to `width` listed nodes of one depth
    (`depths [B, Q]`: each listed node's number of ancestors), the deepest
    depth first, so every node's children are in earlier launches; `slot` is a
    node's place in its launch (`level_row` gathers one launch). A depth where
    some chain lists more than `width` nodes (a chain recomputing every node)
    takes several launches. Entries past `counts[b]` get launch -1.
    """
    b, q = depths.shape
    listed = jnp.arange(q)[None, :] < counts[:, None]
    at_depth = jnp.zeros((b, q), jnp.int32).at[jnp.arange(b)[:, None], depths].add(listed.astype(jnp.int32))
    rounds = jnp.max(-(-at_depth // width), axis=0)  # launches per depth
    first = jnp.cumsum(rounds[::-1])[::-1] - rounds  # launches before a depth's: those of the deeper ones
    deeper = jnp.cumsum(at_depth[:, ::-1], axis=1)[:, ::-1] - at_depth  # per chain, nodes listed before a depth
    rank = jnp.arange(q)[None, :] - jnp.take_along_axis(deeper, depths, axis=1)  # lists are deepest first
    return jnp.where(listed, first[depths] + rank // width, -1), rank % width, jnp.sum(rounds)


def level_row(operations: Int[Array, "B Q"], launch: Int[Array, "B Q"], slot: Int[Array, "B Q"], index,
              width: int) -> Int[Array, "B W"]:
    """Launch `index` of `level_schedule`: each chain's nodes in their slots, -1 where a slot is empty."""
    hit = (launch == index)[:, :, None] & (slot[:, :, None] == jnp.arange(width))
    return jnp.max(jnp.where(hit, operations[:, :, None], -1), axis=1).astype(jnp.int32)


def rescale_by_power_of_two(p: Float[Array, "*batch C patterns S"]):
    """Divide each pattern by `2^e`, `m = f 2^e` its maximum over categories and states (`f` in [1/2, 1); not
    positive: 1); return `e log 2`."""
    top = jnp.max(p, axis=(-3, -1))
    _, exponent = jnp.frexp(jnp.where(top > 0, top, 1.0))
    return jnp.ldexp(p, -exponent[..., None, :, None]), exponent.astype(p.dtype) * jnp.log(2.0).astype(p.dtype)


def kept_log_likelihoods(partials, log_scales, buffer, root, root_frequencies, category_weights,
                         num_tips: int) -> Float[Array, "B patterns"]:
    """`log L_c` from the root's rows: its rescaled partials and the sum of log scale factors below it."""
    row = root - num_tips
    at = take_per_tree(buffer, row)
    return (jnp.log(root_sum(take_per_tree(partials, (at, row)), root_frequencies, category_weights))
            + take_per_tree(log_scales, (at, row)))
