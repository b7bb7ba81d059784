"""Pallas node bodies for large state spaces (amino acids, codons): a pattern tile is a `[T, S]` matrix.

Above `VECTOR_STATES` states, writing `P x` out as `S^2` multiply-adds no
longer pays, so a tile of a partials row is a `[T, S]` block (states padded to
a power of two, `S = 32` for amino acids, 64 for codons; buffers
`[B, rows, tiles, C, T, S]`) and the per-node products are matrix products:
`P x` for every pattern of the tile is `x P^T`, `P^T s` is `s P`.

One category at a time stays in registers (a `[T, 64]` float64 block is
16 KiB), so the rescaling factor, a maximum over categories, is known only
after the last category: every category's product is stored unscaled, then,
after a barrier (global writes of a program are visible to its other threads
only after one), read back and divided. The pre-order body writes each
child's `s` and `p` and the pattern factor `g_c / n_c` of its tile; the
contraction `sum_c (g_c / n_c) s_c p_c^T` over all tiles is a batched matrix
product in XLA afterwards (`_pallas.transition_cotangents`).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt


def padded_states(states: int) -> int:
    """States padded to a power of two of at least 16 (Triton's smallest matrix-product side)."""
    return max(16, 1 << (states - 1).bit_length())


def _barrier(interpret: bool):
    if not interpret:  # interpret mode runs a program's threads as one: nothing to wait for
        plt.debug_barrier()


def _child_block(b, t, r, child, num_tips, sentinel_row, refs):
    """`[T, S]`: the tile of a child's partials in category r (a tip's vectors from its codes)."""
    is_tip = child < num_tips
    tip = refs.tips[jnp.where(is_tip, child, num_tips), t]
    inner = refs.partials[b, jnp.where(is_tip, sentinel_row, child - num_tips), t, r]
    return jnp.where(is_tip, tip, inner)


def _dot(a, b, trans_b=False):
    # Full-precision products in float32 too: Triton's default (TF32) leaves 3e-4 relative errors (H100).
    return plt.dot(a, b, trans_b=trans_b, allow_tf32=False)


def _message(refs, b, child, r, x):
    """`P x` for every pattern of the tile: `x P^T`."""
    return _dot(x, refs.transition[b, child, r], trans_b=True)


def _post_order_node(b, row, t, consts, refs):
    """Row `row`, tile t: `p_k = (P_i x_i) o (P_j x_j)` per category, rescaled, its log factor, and at the root
    the category sum `sum_r w_r pi^T p_root,r`."""
    num_tips, sentinel_row, num_categories, _, interpret = consts
    children = [refs.children[b, row, k] for k in range(2)]

    def unscaled(r, widest):
        m = [_message(refs, b, c, r, _child_block(b, t, r, c, num_tips, sentinel_row, refs)) for c in children]
        product = m[0] * m[1]
        refs.partials[b, row, t, r] = product
        return jnp.maximum(widest, jnp.max(product, axis=1))

    scale = lax.fori_loop(0, num_categories, unscaled, jnp.zeros(refs.log_scales.shape[-1], refs.partials.dtype))
    scale = jnp.where(scale > 0, scale, 1.0)
    _barrier(interpret)
    frequencies = refs.frequencies[b]

    def rescaled(r, root_sum):
        p = refs.partials[b, row, t, r] / scale[:, None]
        refs.partials[b, row, t, r] = p
        return root_sum + refs.weights[b, r] * jnp.sum(p * frequencies[None, :], axis=1)

    root_sum = lax.fori_loop(0, num_categories, rescaled, jnp.zeros_like(scale))
    refs.log_scales[b, row, t, :] = jnp.log(scale)

    @pl.when(row == refs.root_row[b])
    def _():
        refs.root_sums[b, t, :] = root_sum


def _pre_order_node(b, w, row, t, real, consts, refs):
    """Row `row` as a parent: `s_i = q_k o P_j p_j` and `q_i = rescale(P_i^T s_i)` for both children; writes
    `s_i`, `p_i` and `g_c / n_c` (zero for padding) to slot `w` of the step's outputs."""
    num_tips, sentinel_row, num_categories, _, interpret = consts
    children = [refs.children[b, row, k] for k in range(2)]
    kept = [(c >= num_tips) & (c != num_tips + sentinel_row) for c in children]  # only internal children's q

    def unscaled(r, carry):
        norm, widest = carry
        q = refs.q[b, row, t, r]
        p = [_child_block(b, t, r, c, num_tips, sentinel_row, refs) for c in children]
        m = [_message(refs, b, c, r, x) for c, x in zip(children, p)]
        s = [q * m[1], q * m[0]]
        for k in range(2):
            refs.s[b, w, k, t, r] = s[k]
            refs.p[b, w, k, t, r] = p[k]

        def up(k):
            up = _dot(s[k], refs.transition[b, children[k], r])  # `P^T s` per pattern
            refs.q[b, children[k] - num_tips, t, r] = up
            return jnp.maximum(widest[k], jnp.max(up, axis=1))

        widest = tuple(lax.cond(kept[k], lambda k=k: up(k), lambda k=k: widest[k]) for k in range(2))
        return norm + jnp.sum(s[0] * m[0], axis=1), widest

    tile = refs.cotangent.shape[-1]
    zeros = jnp.zeros(tile, refs.q.dtype)
    start = (zeros, (zeros, zeros))
    norm, widest = lax.fori_loop(0, num_categories, unscaled, start)
    counted = (children[0] != num_tips + sentinel_row) & real
    refs.alpha[b, w, t, :] = jnp.where(counted, refs.cotangent[b, t, :] / jnp.where(counted, norm, 1.0), 0.0)
    scales = [jnp.where(x > 0, x, 1.0) for x in widest]
    _barrier(interpret)

    def rescaled(r, carry):
        for k in range(2):
            @pl.when(kept[k])
            def _(k=k):
                row = children[k] - num_tips
                refs.q[b, row, t, r] = refs.q[b, row, t, r] / scales[k][:, None]
        return carry

    lax.fori_loop(0, num_categories, rescaled, 0)


def post_order_step(consts, refs):
    b, w, t = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    _post_order_node(b, refs.start[b] + w, t, consts, refs)


def pre_order_step(consts, refs):
    b, w, t = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    _pre_order_node(b, w, refs.start[b] + w, t, refs.real[b] != 0, consts, refs)
