"""Felsenstein's post-order peeling over a level schedule.

For internal node k with children i, j, in every rate category and pattern:
`p_k = (P_i p_i) * (P_j p_j)`. A tip's `p_i` is its row of the 0/1 tip table,
so ambiguity codes cost nothing extra; tips and internal children of one step
go through the same product (computing a tip's message as a gather instead and
selecting between the two read every child twice). After each node, partials
are divided by their maximum over categories and states per pattern, and the
log of that factor is kept: the likelihood is then
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


def child_partials(
    children: Int[Array, "W 2"],
    partials: Float[Array, "rows C patterns S"],
    tip_codes: Int[Array, "tips_plus_one patterns"],
    tip_table: Float[Array, "codes S"],
) -> Float[Array, "W 2 C patterns S"]:
    """Rescaled partials `p_child`: a tip's 0/1 vector, or an internal node's buffer row."""
    num_tips = tip_codes.shape[0] - 1
    is_tip = children < num_tips
    internal = partials[jnp.where(is_tip, partials.shape[0] - 1, children - num_tips)]
    tip = tip_table[tip_codes[jnp.where(is_tip, children, num_tips)]]
    return jnp.where(is_tip[..., None, None, None], tip[:, :, None], internal)


def rescale(p: Float[Array, "*batch C patterns S"]):
    """Divide by the maximum over categories and states of each pattern; return it as a log."""
    scale = jnp.max(p, axis=(-3, -1))
    scale = jnp.where(scale > 0, scale, 1.0)
    return p / scale[..., None, :, None], jnp.log(scale)


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
        messages = apply_transition(transition[children], child_partials(children, partials, tip_codes, tip_table))
        p, log_scale = rescale(messages[:, 0] * messages[:, 1])
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
    return log_likelihoods_from(partials, log_scales, root_frequencies, category_weights)


def root_likelihoods(partials, root_frequencies, category_weights) -> Float[Array, " patterns"]:
    """`sum_r w_r pi^T p_root,r` per pattern, on the rescaled root partials (the row before the sentinel)."""
    return jnp.einsum("c,s,cps->p", category_weights, root_frequencies, partials[-2])


def log_likelihoods_from(partials, log_scales, root_frequencies, category_weights) -> Float[Array, " patterns"]:
    """`log L_c`: the root sum plus every node's log scale factor."""
    scaled = root_likelihoods(partials, root_frequencies, category_weights)
    return jnp.log(scaled) + jnp.sum(log_scales[:-1], axis=0)
