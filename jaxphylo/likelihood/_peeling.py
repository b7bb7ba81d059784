"""Felsenstein's post-order peeling over a level schedule.

For internal node k with children i, j, in every rate category and pattern:
`p_k = (P_i p_i) * (P_j p_j)`. A tip's message `P_i p_i` is a gather: row
`code` of `P_i @ tip_table^T`, so ambiguity codes cost nothing extra. After each
node, partials are divided by their maximum over categories and states per
pattern, and the log of that factor is kept: the likelihood is then
`log L_c = log(sum_r w_r pi^T p_root,r,c) + sum_k log scale_k,c`.

Buffers hold internal nodes only (row = kernel node - N), plus one sentinel
row of ones that padded slots read and write.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float, Int

from .._schedule import Schedule

SMALL_STATE_SPACE = 8  # below this, P x as a broadcast multiply-add beats a batched matmul


def apply_transition(
    p: Float[Array, "*batch C S S"], x: Float[Array, "*batch C patterns S"]
) -> Float[Array, "*batch C patterns S"]:
    """`(P x)_i = sum_j P_ij x_j` for every pattern."""
    if p.shape[-1] <= SMALL_STATE_SPACE:
        return jnp.sum(p[..., None, :, :] * x[..., :, None, :], axis=-1)
    return jnp.einsum("...cij,...cpj->...cpi", p, x)


def child_messages(
    child: Int[Array, " W"],
    transition: Float[Array, "kernel_nodes C S S"],
    partials: Float[Array, "rows C patterns S"],
    tip_codes: Int[Array, "tips_plus_one patterns"],
    tip_table: Float[Array, "codes S"],
) -> Float[Array, "W C patterns S"]:
    """`P_child p_child` for a batch of children, tips by gather, internal nodes by product."""
    num_tips = tip_codes.shape[0] - 1
    sentinel_row = partials.shape[0] - 1
    is_tip = child < num_tips
    p = transition[child]
    internal = apply_transition(p, partials[jnp.where(is_tip, sentinel_row, child - num_tips)])
    by_code = jnp.einsum("wcij,kj->wcki", p, tip_table)  # message for every tip code
    codes = tip_codes[jnp.where(is_tip, child, num_tips)]
    tip = jnp.take_along_axis(by_code, codes[:, None, :, None], axis=2)
    return jnp.where(is_tip[:, None, None, None], tip, internal)


def rescale(p):
    scale = jnp.max(p, axis=(1, 3))
    scale = jnp.where(scale > 0, scale, 1.0)
    return p / scale[:, None, :, None], jnp.log(scale)


def level_loop(schedule: Schedule, body, carry, static_steps=None, reverse=False):
    """Run `body(carry, nodes, children)` over every step of the schedule.

    Step counts are data (a while loop), so any topology of N taxa shares one
    compiled program; `static_steps` gives Python counts instead, which plain
    reverse-mode autodiff needs.
    """
    phases = list(enumerate(schedule.widths))
    for j, width in reversed(phases) if reverse else phases:
        num_steps = schedule.steps[j] if static_steps is None else static_steps[j]

        def step(i, carry, j=j, width=width, num_steps=num_steps):
            i = num_steps - 1 - i if reverse else i
            start = schedule.offsets[j] + i * width
            nodes = lax.dynamic_slice_in_dim(schedule.nodes, start, width)
            children = lax.dynamic_slice_in_dim(schedule.children, start, width)
            return body(carry, nodes, children)

        carry = lax.fori_loop(0, num_steps, step, carry)
    return carry


def post_order_partials(
    transition: Float[Array, "kernel_nodes C S S"],
    tip_codes: Int[Array, "tips_plus_one patterns"],
    tip_table: Float[Array, "codes S"],
    schedule: Schedule,
    static_steps=None,
) -> tuple[Float[Array, "rows C patterns S"], Float[Array, "rows patterns"]]:
    """Rescaled partials of every internal node and their per-pattern log scale factors."""
    num_tips = schedule.num_tips
    _, c, s, _ = transition.shape
    patterns = tip_codes.shape[1]
    partials = jnp.ones((num_tips, c, patterns, s), transition.dtype)  # N-1 internal + sentinel
    log_scales = jnp.zeros((num_tips, patterns), transition.dtype)

    def body(carry, nodes, children):
        partials, log_scales = carry
        left = child_messages(children[:, 0], transition, partials, tip_codes, tip_table)
        right = child_messages(children[:, 1], transition, partials, tip_codes, tip_table)
        p, log_scale = rescale(left * right)
        rows = nodes - num_tips
        return partials.at[rows].set(p), log_scales.at[rows].set(log_scale)

    return level_loop(schedule, body, (partials, log_scales), static_steps)


def pattern_log_likelihoods(
    transition: Float[Array, "kernel_nodes C S S"],
    root_frequencies: Float[Array, " S"],
    category_weights: Float[Array, " C"],
    tip_codes: Int[Array, "tips_plus_one patterns"],
    tip_table: Float[Array, "codes S"],
    schedule: Schedule,
    static_steps=None,
) -> Float[Array, " patterns"]:
    """`log L_c` for every site pattern."""
    partials, log_scales = post_order_partials(transition, tip_codes, tip_table, schedule, static_steps)
    root = partials[schedule.num_tips - 2]
    scaled = jnp.einsum("c,s,cps->p", category_weights, root_frequencies, root)
    return jnp.log(scaled) + jnp.sum(log_scales[:-1], axis=0)
