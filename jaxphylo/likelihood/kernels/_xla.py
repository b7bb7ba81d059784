"""Felsenstein's post-order peeling over a level schedule, for a batch of trees.

For internal node k with children i, j, in every rate category and pattern:
`p_k = (P_i p_i) * (P_j p_j)`. A tip's `p_i` is its row of the 0/1 tip table,
so ambiguity codes cost nothing extra. After each node, partials are divided
by their maximum over categories and states per pattern, and the log of that
factor is kept: the likelihood is then
`log L_c = log(sum_r w_r pi^T p_root,r,c) + sum_k log scale_k,c`.

Buffers are `[batch, slots + 1, C, patterns, S]`: row `r` holds slot `r` of
the schedule and the last row is the sentinel's ones, so a step reads its
children by gather and writes one contiguous block of rows in place.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from ...runtime import product_precision, take_per_tree
from ...tree import Schedule
from ._walk import level_loop, step_children, write_rows

SMALL_STATE_SPACE = 8  # up to this, on a GPU, P x as multiply-adds written out beats a batched matmul


def apply_transition(
    p: Float[Array, "*batch C S S"], x: Float[Array, "*batch C patterns S"]
) -> Float[Array, "*batch C patterns S"]:
    """`(P x)_i = sum_j P_ij x_j` for every pattern."""
    if p.shape[-1] <= SMALL_STATE_SPACE and jax.default_backend() != "cpu":
        # On a GPU, written out over j, so that XLA sees elementwise work it can fuse into what consumes the
        # messages, not a reduction whose output must go through memory first (the matmul form was slower
        # inside the passes there: benchmarks/results/kernel-versions-gpu.json). On a CPU the matmul form
        # compiles and runs fastest (a batch of 8 DS1 trees' gradient: 4.9 s / 133 ms, against 5.7 s / 132 ms
        # written out and 5.2 s / 236 ms as a broadcast sum).
        return sum(p[..., None, :, j] * x[..., j:j + 1] for j in range(p.shape[-1]))
    return jnp.einsum("...cij,...cpj->...cpi", p, x, precision=product_precision())


def child_partials(
    children: Int[Array, "B W 2"],
    partials: Float[Array, "B rows C patterns S"],
    tip_codes: Int[Array, "tips_plus_one patterns"],
    tip_table: Float[Array, "codes S"],
) -> Float[Array, "B W 2 C patterns S"]:
    """Rescaled partials `p_child`: a tip's 0/1 vector, or an internal node's buffer row."""
    num_tips = tip_codes.shape[0] - 1
    is_tip = children < num_tips
    rows = jnp.where(is_tip, partials.shape[1] - 1, children - num_tips)
    internal = take_per_tree(partials, rows)
    tip = tip_table[tip_codes[jnp.where(is_tip, children, num_tips)]]
    return jnp.where(is_tip[..., None, None, None], tip[..., None, :, :], internal)


def rescale(p: Float[Array, "*batch C patterns S"]):
    """Divide by the maximum over categories and states of each pattern; return it as a log."""
    scale = jnp.max(p, axis=(-3, -1))
    scale = jnp.where(scale > 0, scale, 1.0)
    return p / scale[..., None, :, None], jnp.log(scale)


def post_order_partials(
    transition: Float[Array, "B ids C S S"],
    tip_codes: Int[Array, "tips_plus_one patterns"],
    tip_table: Float[Array, "codes S"],
    schedule: Schedule,
    static_steps=None,
) -> tuple[Float[Array, "B rows C patterns S"], Float[Array, "B rows patterns"]]:
    """Rescaled partials of every slot (and the sentinel row) and their per-pattern log scale factors."""
    b, _, c, s, _ = transition.shape
    rows, patterns = schedule.num_slots + 1, tip_codes.shape[1]
    partials = jnp.ones((b, rows, c, patterns, s), transition.dtype)
    log_scales = jnp.zeros((b, rows, patterns), transition.dtype)

    def body(carry, start, real, width):
        partials, log_scales = carry
        children = step_children(schedule, start, width)
        matrices = take_per_tree(transition, children)
        messages = apply_transition(matrices, child_partials(children, partials, tip_codes, tip_table))
        p, log_scale = rescale(messages[:, :, 0] * messages[:, :, 1])
        return write_rows(partials, p, start), write_rows(log_scales, log_scale, start)

    return level_loop(schedule, body, (partials, log_scales), static_steps=static_steps)


def root_sum(root: Float[Array, "B C patterns S"], root_frequencies, category_weights) -> Float[Array, "B patterns"]:
    """`sum_r w_r pi^T p_root,r` per pattern."""
    return jnp.einsum("bc,bs,bcps->bp", category_weights, root_frequencies, root, precision=product_precision())


def root_likelihoods(partials, root_frequencies, category_weights, schedule: Schedule) -> Float[Array, "B patterns"]:
    """`root_sum` on the rescaled root partials of the buffers."""
    root = take_per_tree(partials, schedule.root_row)
    return root_sum(root, root_frequencies, category_weights)


def log_likelihoods_from(partials, log_scales, root_frequencies, category_weights, schedule) -> Float[Array, "B patterns"]:
    """`log L_c`: the root sum plus every node's log scale factor (padding rows hold zeros)."""
    scaled = root_likelihoods(partials, root_frequencies, category_weights, schedule)
    return jnp.log(scaled) + jnp.sum(log_scales, axis=1)


def pattern_log_likelihoods(transition, root_frequencies, category_weights, tip_codes, tip_table, schedule,
                            static_steps):
    """`log L_c` for every tree and site pattern, for plain autodiff through fixed-length loops (a reference)."""
    partials, log_scales = post_order_partials(transition, tip_codes, tip_table, schedule, static_steps)
    return log_likelihoods_from(partials, log_scales, root_frequencies, category_weights, schedule)
