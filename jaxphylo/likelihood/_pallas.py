"""The post-order and pre-order passes as Pallas kernels: gather, `P x`, product, rescale and row write fused.

Two schedules, as DESIGN.md's probe measured them on an H100:
- *steps*: one launch per schedule step (BEAGLE's level schedule), grid
  `(trees, nodes of the step, pattern tiles)`, inside the level loops, whose
  step counts remain data (a new topology of N taxa reuses the program);
- *walk*, for small trees (`walks`): one launch per pass, grid `(trees,
  pattern tiles)`, each program visiting every row of its tree in order
  (rows are in post-order), so levels need no launch boundary; a tree's whole
  pass then costs one launch instead of one (and a loop iteration) per step.

Program `(b, ..., t)` reads a node's two children for its tile of patterns (a
tip's vectors from the tips' table, an internal child's row of the partials
buffer) and forms, in every rate category `r`,

    p_k,r = (P_i,r x_i,r) o (P_j,r x_j,r),

divided by the tile's per-pattern maximum over categories and states, whose
log is kept. The pre-order node forms `s_i = q_k o (P_j p_j)`, writes
`q_i = P_i^T s_i` (rescaled) to internal children, and adds the tile's
`sum_c g_c s_i,c p_i,c^T / n_c` to the node's slot of a per-tile buffer, which is
summed over tiles and scattered to the branches once, at the end.
Everything between the loads of the children and the stores stays in registers.

The kernels run through Triton on a GPU, and in Pallas's interpret mode on a
CPU, where the tests check them against the XLA passes. Triton wants every
array of a kernel to have a power-of-two size, so the kernels handle one state
of one pattern tile (`T` patterns, a power of two) at a time: buffers are laid
out `[B, rows, tiles, C, S, T]` between the passes, patterns padded to whole
tiles with all-ones tips, and `P x` is written out as `S^2` multiply-adds of
tile vectors by scalars. That suits nucleotides (`S = 4`); larger state
spaces keep the XLA passes.
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jaxtyping import Array, Float, Int

from .._schedule import Schedule

PATTERN_TILE = 128  # patterns per program; with NUM_WARPS the best of those measured (pallas_probe-gpu.json)
NUM_WARPS = 4
WALK_MAX_TIPS = 32  # up to this many taxa a pass is one launch walking the nodes: H100, pallas_probe-walk-gpu.json
MAX_STATES = 8  # the kernels write `P x` out as `S^2` multiply-adds per category: nucleotides
KERNEL_ENV = "JAXPHYLO_KERNEL"


def wanted(states: int) -> bool:
    """Whether the passes use the Pallas kernels for `states` states: `JAXPHYLO_KERNEL=pallas` asks for them.

    Opt-in: on an H100 they are 1.4x faster at 1,000 x 10,000 and 3x on batches of 64 trees, about even on
    single trees of 50-1,000 taxa, and Triton compiles each program 5-8x longer (README, "Pallas kernels")."""
    return os.environ.get(KERNEL_ENV, "xla").lower() == "pallas" and states <= MAX_STATES


def _compiler_params():
    if jax.default_backend() == "gpu":
        from jax.experimental.pallas import triton as plt

        return plt.CompilerParams(num_warps=NUM_WARPS, num_stages=1)
    return None


def _child_vectors(b, t, child, num_tips, sentinel_row, num_categories, num_states, tips_ref, partials_ref):
    """`x[r][j]`, the `[T]` tile of a child's partials in category r and state j (a tip's from its codes)."""
    is_tip = child < num_tips
    tip_row = jnp.where(is_tip, child, num_tips)
    source = jnp.where(is_tip, sentinel_row, child - num_tips)
    # Every vector is one pattern tile `[T]`: Triton handles those best (no small inner axes).
    tip = [tips_ref[tip_row, t, j, :] for j in range(num_states)]
    return [[jnp.where(is_tip, tip[j], partials_ref[b, source, t, r, j, :]) for j in range(num_states)]
            for r in range(num_categories)]


def _times(transition_ref, b, child, r, x, transpose=False):
    """`P x` (or `P^T x`) of category r's matrix of `child`'s branch, each state a `[T]` vector."""
    n = len(x)
    entry = (lambda i, j: transition_ref[b, child, r, j, i]) if transpose else (lambda i, j: transition_ref[b, child, r, i, j])
    out = []
    for i in range(n):
        total = entry(i, 0) * x[0]
        for j in range(1, n):
            total = total + entry(i, j) * x[j]
        out.append(total)
    return out


def _tile_max(vectors):
    """The per-pattern maximum over categories and states, 1 where it is 0 (a pattern no state explains)."""
    scale = vectors[0][0]
    for per_state in vectors:
        for v in per_state:
            scale = jnp.maximum(scale, v)
    return jnp.where(scale > 0, scale, 1.0)


def _post_order_node(b, row, t, consts, children_ref, transition_ref, tips_ref, partials_ref, scales_ref):
    """Row `row` of tree b, pattern tile t: `p_k = (P_i x_i) o (P_j x_j)`, rescaled, and its log factor."""
    num_tips, sentinel_row, num_categories, num_states = consts
    products = None
    for k in range(2):
        child = children_ref[b, row, k]
        x = _child_vectors(b, t, child, *consts, tips_ref, partials_ref)
        messages = [_times(transition_ref, b, child, r, x[r]) for r in range(num_categories)]
        products = messages if k == 0 else [[p * m for p, m in zip(ps, ms)] for ps, ms in zip(products, messages)]
    scale = _tile_max(products)
    for r in range(num_categories):
        for i in range(num_states):
            partials_ref[b, row, t, r, i, :] = products[r][i] / scale
    scales_ref[b, row, t, :] = jnp.log(scale)


def _pre_order_node(b, row, t, real, consts, children_ref, transition_ref, tips_ref, partials_ref, cotangent_ref,
                    q_ref, d_ref):
    """Row `row` as a parent: `s_i = q_k o P_j p_j`, `q_i = rescale(P_i^T s_i)` for both children, and
    `sum_c g_c s_i,c p_i,c^T / n_c` over the tile added to the row's `[2, C, S, S]` slot of `d_ref`."""
    num_tips, sentinel_row, num_categories, num_states = consts
    parent = [[q_ref[b, row, t, r, i, :] for i in range(num_states)] for r in range(num_categories)]
    children = [children_ref[b, row, k] for k in range(2)]
    p = [_child_vectors(b, t, child, *consts, tips_ref, partials_ref) for child in children]
    messages = [[_times(transition_ref, b, child, r, p[k][r]) for r in range(num_categories)]
                for k, child in enumerate(children)]
    s = [[[q * m for q, m in zip(parent[r], messages[1 - k][r])] for r in range(num_categories)] for k in range(2)]
    norm = sum(a * m for r in range(num_categories) for a, m in zip(s[0][r], messages[0][r]))
    counted = (children[0] != num_tips + sentinel_row) & real
    alpha = jnp.where(counted, cotangent_ref[b, t, :] / jnp.where(counted, norm, 1.0), 0.0)
    for k, child in enumerate(children):
        for r in range(num_categories):
            weighted = [alpha * v for v in s[k][r]]
            for i in range(num_states):
                for j in range(num_states):
                    # Added, not stored: padding steps revisit the root's block (adding zeros there).
                    d_ref[b, row, t, k, r, i, j] += jnp.sum(weighted[i] * p[k][r][j])
        up = [_times(transition_ref, b, child, r, s[k][r], transpose=True) for r in range(num_categories)]
        scale = _tile_max(up)
        kept = (child >= num_tips) & (child != num_tips + sentinel_row)
        target = jnp.where(kept, child - num_tips, sentinel_row + 1)  # tips and padding write a spare row
        for r in range(num_categories):
            for j in range(num_states):
                q_ref[b, target, t, r, j, :] = up[r][j] / scale


# Kernels. Aliased inputs (`*_in`) are never read: the outputs hold their values and are read instead,
# which is the same memory on a GPU and the right values in interpret mode too.

def _post_order_step_kernel(consts, start_ref, children_ref, transition_ref, tips_ref, partials_in, scales_in,
                            partials_ref, scales_ref):
    b, w, t = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    _post_order_node(b, start_ref[b] + w, t, consts, children_ref, transition_ref, tips_ref, partials_ref, scales_ref)


def _post_order_walk_kernel(consts, root_ref, children_ref, transition_ref, tips_ref, partials_in, scales_in,
                            partials_ref, scales_ref):
    """Every row up to the root's, in order, for one tile: rows are in post-order, and a program reads back
    only what it wrote itself, so no launch boundary is needed between levels."""
    b, t = pl.program_id(0), pl.program_id(1)

    def node(row, carry):
        _post_order_node(b, row, t, consts, children_ref, transition_ref, tips_ref, partials_ref, scales_ref)
        return carry

    lax.fori_loop(0, root_ref[b] + 1, node, 0)


def _pre_order_step_kernel(consts, start_ref, real_ref, children_ref, transition_ref, tips_ref, partials_ref,
                           cotangent_ref, q_in, d_in, q_ref, d_ref):
    b, w, t = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    _pre_order_node(b, start_ref[b] + w, t, real_ref[b] != 0, consts, children_ref, transition_ref, tips_ref,
                    partials_ref, cotangent_ref, q_ref, d_ref)


def _pre_order_walk_kernel(consts, root_ref, children_ref, transition_ref, tips_ref, partials_ref, cotangent_ref,
                           q_in, d_in, q_ref, d_ref):
    b, t = pl.program_id(0), pl.program_id(1)
    root = root_ref[b]

    def node(i, carry):
        _pre_order_node(b, root - i, t, True, consts, children_ref, transition_ref, tips_ref, partials_ref,
                        cotangent_ref, q_ref, d_ref)
        return carry

    lax.fori_loop(0, root + 1, node, 0)


def _grid_call(kernel, out_shapes, aliases, shape_args, width: int | None, interpret: bool, name: str):
    """Programs `(tree, node of the step, tile)`, or `(tree, tile)` for a walk (`width` None)."""
    batch, _, tiles, *_ = shape_args
    return pl.pallas_call(
        kernel,
        out_shape=out_shapes,
        grid=(batch, tiles) if width is None else (batch, width, tiles),
        input_output_aliases=aliases,
        interpret=interpret,
        compiler_params=_compiler_params(),
        name=name if width is None else f"{name}_w{width}",
    )


def walks(num_tips: int) -> bool:
    """Whether a pass is one launch walking every node (small trees) rather than one launch per step."""
    return num_tips <= WALK_MAX_TIPS


def _tiled(x: Float[Array, "*lead patterns"], tiles: int, fill) -> Float[Array, "*lead tiles T"]:
    """Patterns padded to whole tiles and split into `[tiles, T]`."""
    padded = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, tiles * PATTERN_TILE - x.shape[-1])], constant_values=fill)
    return padded.reshape(x.shape[:-1] + (tiles, PATTERN_TILE))


def _tip_tiles(tip_codes, tip_table, dtype) -> Float[Array, "tips_plus_one tiles S T"]:
    tiles = -(-tip_codes.shape[1] // PATTERN_TILE)
    tips = _tiled(jnp.moveaxis(tip_table.astype(dtype)[tip_codes], -1, -2), tiles, 1.0)  # [N+1, S, tiles, T]
    return jnp.moveaxis(tips, -2, 1)


def _interpret(interpret):
    return jax.default_backend() == "cpu" if interpret is None else interpret


class TiledPartials(NamedTuple):
    """Post-order output in the kernels' layout: partials `[B, rows, tiles, C, S, T]`, log scales
    `[B, rows, tiles, T]`, and the tips' vectors `[N+1, tiles, S, T]` the pre-order pass reads again."""

    partials: Array
    log_scales: Array
    tips: Array


def post_order_tiled(transition: Float[Array, "B ids C S S"], tip_codes: Int[Array, "tips_plus_one patterns"],
                     tip_table: Float[Array, "codes S"], schedule: Schedule, static_steps=None,
                     interpret: bool | None = None) -> TiledPartials:
    """The post-order pass in the kernels' tiled layout: one launch per step, or one walk for small trees."""
    from ._peeling import level_loop

    b, _, c, s, _ = transition.shape
    tips = _tip_tiles(tip_codes, tip_table, transition.dtype)
    tiles, rows = tips.shape[1], schedule.num_slots + 1
    partials = jnp.ones((b, rows, tiles, c, s, PATTERN_TILE), transition.dtype)
    log_scales = jnp.zeros((b, rows, tiles, PATTERN_TILE), transition.dtype)
    out_shapes = (jax.ShapeDtypeStruct(partials.shape, partials.dtype),
                  jax.ShapeDtypeStruct(log_scales.shape, log_scales.dtype))
    consts = (schedule.num_tips, rows - 1, c, s)
    children = schedule.children.astype(jnp.int32)
    call = functools.partial(_grid_call, out_shapes=out_shapes, aliases={4: 0, 5: 1}, shape_args=partials.shape,
                             interpret=_interpret(interpret))
    if walks(schedule.num_tips):
        walk = call(functools.partial(_post_order_walk_kernel, consts), width=None, name="post_order_walk")
        partials, log_scales = walk(schedule.root_row.astype(jnp.int32), children, transition, tips, partials,
                                    log_scales)
        return TiledPartials(partials, log_scales, tips)

    def body(carry, start, real, width):
        step = call(functools.partial(_post_order_step_kernel, consts), width=width, name="post_order")
        return step(start.astype(jnp.int32), children, transition, tips, *carry)

    partials, log_scales = level_loop(schedule, body, (partials, log_scales), static_steps=static_steps)
    return TiledPartials(partials, log_scales, tips)


def untiled(x: Float[Array, "*lead tiles C S T"], patterns: int) -> Float[Array, "*lead C patterns S"]:
    """Tiled partials back in the passes' layout `[..., C, patterns, S]`."""
    *lead, tiles, c, s, t = x.shape
    return jnp.moveaxis(x, -4, -3).swapaxes(-1, -2).reshape(*lead, c, tiles * t, s)[..., :patterns, :]


def post_order_partials(
    transition: Float[Array, "B ids C S S"],
    tip_codes: Int[Array, "tips_plus_one patterns"],
    tip_table: Float[Array, "codes S"],
    schedule: Schedule,
    static_steps=None,
    interpret: bool | None = None,
) -> tuple[Float[Array, "B rows C patterns S"], Float[Array, "B rows patterns"]]:
    """`_peeling.post_order_partials` through the Pallas step (same outputs, same layout)."""
    tiled = post_order_tiled(transition, tip_codes, tip_table, schedule, static_steps, interpret)
    patterns = tip_codes.shape[1]
    b, rows = tiled.log_scales.shape[:2]
    return untiled(tiled.partials, patterns), tiled.log_scales.reshape(b, rows, -1)[..., :patterns]


def root_partials(tiled: TiledPartials, schedule: Schedule, patterns: int) -> Float[Array, "B C patterns S"]:
    return untiled(jax.vmap(lambda buffer, r: buffer[r])(tiled.partials, schedule.root_row), patterns)


def total_log_scales(tiled: TiledPartials, patterns: int) -> Float[Array, "B patterns"]:
    b = tiled.log_scales.shape[0]
    return jnp.sum(tiled.log_scales, axis=1).reshape(b, -1)[:, :patterns]


def transition_cotangents(
    transition: Float[Array, "B ids C S S"],
    root_frequencies: Float[Array, "B S"],
    category_weights: Float[Array, "B C"],
    tiled: TiledPartials,
    pattern_cotangent: Float[Array, "B patterns"],
    schedule: Schedule,
    static_steps=None,
    interpret: bool | None = None,
) -> Float[Array, "B ids C S S"]:
    """`sum_c g_c d log L_c / d P` for every branch: the pre-order pass, each step one Pallas launch.

    Each program adds its tile's `sum_c g_c s_i,c p_i,c^T / n_c` into row k's
    slot of a `[B, rows, tiles, 2, C, S, S]` buffer (no two programs share a
    slot); the tiles are summed and scattered to the children's layout ids once, at the end.
    """
    from ._peeling import level_loop

    b, rows, tiles, c, s, _ = tiled.partials.shape
    batch = jnp.arange(b)
    root = (category_weights[:, :, None] * root_frequencies[:, None, :])[:, None, :, :, None]  # [B, 1, C, S, 1]
    q = jnp.ones((b, rows + 1, tiles, c, s, PATTERN_TILE), transition.dtype)
    q = q.at[batch, schedule.root_row].set(jnp.broadcast_to(root, (b, tiles, c, s, PATTERN_TILE)))
    d = jnp.zeros((b, rows, tiles, 2, c, s, s), transition.dtype)
    cotangent = _tiled(pattern_cotangent.astype(transition.dtype), tiles, 0.0)
    out_shapes = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(d.shape, d.dtype))
    consts = (schedule.num_tips, rows - 1, c, s)
    children = schedule.children.astype(jnp.int32)
    call = functools.partial(_grid_call, out_shapes=out_shapes, shape_args=tiled.partials.shape,
                             interpret=_interpret(interpret))
    if walks(schedule.num_tips):
        walk = call(functools.partial(_pre_order_walk_kernel, consts), aliases={6: 0, 7: 1}, width=None,
                    name="pre_order_walk")
        _, d = walk(schedule.root_row.astype(jnp.int32), children, transition, tiled.tips, tiled.partials, cotangent,
                    q, d)
    else:
        def body(carry, start, real, width):
            step = call(functools.partial(_pre_order_step_kernel, consts), aliases={7: 0, 8: 1}, width=width,
                        name="pre_order")
            return step(start.astype(jnp.int32), real.astype(jnp.int32), children, transition, tiled.tips,
                        tiled.partials, cotangent, *carry)

        _, d = level_loop(schedule, body, (q, d), reverse=True, static_steps=static_steps)
    per_row = jnp.sum(d[:, :-1], axis=2)  # [B, slots, 2, C, S, S]
    return jnp.zeros_like(transition).at[batch[:, None, None], children].add(per_row)
