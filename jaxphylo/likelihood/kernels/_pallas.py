"""The post-order and pre-order passes as Pallas kernels: gather, `P x`, product, rescale and row write fused.

Two schedules, as DESIGN.md's probe measured them on an H100:
- *steps*: one launch per schedule step (BEAGLE's level schedule), grid
  `(trees, nodes of the step, pattern tiles)`, inside the level loops, whose
  step counts remain data (a new topology of N taxa reuses the program);
- *walk*, for small trees of few states (`walks`): one launch per pass, grid
  `(trees, pattern tiles)`, each program visiting every row of its tree in
  order (rows are in post-order), so levels need no launch boundary.

Program `(b, ..., t)` reads a node's two children for its tile of patterns (a
tip's vectors from the tips' table, an internal child's row of the partials
buffer) and forms, in every rate category `r`,

    p_k,r = (P_i,r x_i,r) o (P_j,r x_j,r),

divided by the tile's per-pattern maximum over categories and states, whose
log is kept; the root's program also forms the category sum
`sum_r w_r pi^T p_root,r`. The pre-order node forms `s_i = q_k o (P_j p_j)`
and writes `q_i = P_i^T s_i` (rescaled) to internal children.

What a tile is depends on the state count: nucleotides' tiles are `C x S`
vectors of `T` patterns with `P x` written out (`_pallas_vectors`, which also
contracts `d log L / d P` in the kernel); larger state spaces' are `[T, S]`
blocks with matrix products (`_pallas_blocks`, whose contraction is a batched
matrix product afterwards). The kernels run through Triton on a GPU, and in
Pallas's interpret mode on a CPU, where the tests check them against the XLA
passes.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jaxtyping import Array, Float, Int

from ...runtime import add_per_tree, product_precision, set_per_tree, take_per_tree
from ...tree import Schedule, kernel_children
from . import _pallas_blocks, _pallas_vectors, _update
from ._pallas_blocks import padded_states
from ._pallas_vectors import VECTOR_STATES
from ._walk import level_loop, step_children

PATTERN_TILE = 128  # patterns per program for vectors; with NUM_WARPS the best measured (pallas_probe-gpu.json)
BLOCK_ELEMENTS = 2048  # a block tile holds T x S of them: T = 32 for codons, 64 for amino acids (probe_dot, H100)
NUM_WARPS = 4
WALK_MAX_TIPS = 32  # up to this many taxa a pass is one launch walking the nodes: H100, pallas_probe-walk-gpu.json
MAX_STATES = 64  # codons, padded to 64


def blocked(states: int) -> bool:
    """Whether tiles are `[T, S]` blocks with matrix products (else `S` vectors of `T` patterns)."""
    return states > VECTOR_STATES


def walks(num_tips: int, states: int = 4) -> bool:
    """Whether a pass is one launch walking every node (small trees) rather than one launch per step."""
    return num_tips <= WALK_MAX_TIPS and not blocked(states)


def _compiler_params(num_warps: int = NUM_WARPS):
    if jax.default_backend() == "gpu":
        from jax.experimental.pallas import triton as plt

        return plt.CompilerParams(num_warps=num_warps, num_stages=1)
    return None


def _interpret(interpret):
    return jax.default_backend() == "cpu" if interpret is None else interpret


def _call(body, consts, inputs: tuple[str, ...], outputs: dict, aliases: dict, grid, interpret: bool, name: str,
          num_warps: int = NUM_WARPS):
    """`pallas_call` of `body(consts, refs)`, its refs named: an aliased input's name is its output's."""

    def kernel(*refs):
        named = dict(zip(inputs, refs))
        named.update(zip(outputs, refs[len(inputs):]))
        body(consts, SimpleNamespace(**named))

    return pl.pallas_call(kernel, out_shape=tuple(outputs.values()), grid=grid, input_output_aliases=aliases,
                          interpret=interpret, compiler_params=_compiler_params(num_warps), name=name)


def _shape(x) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _tiled(x: Float[Array, "*lead patterns"], tiles: int, tile: int, fill) -> Float[Array, "*lead tiles T"]:
    """Patterns padded to whole tiles and split into `[tiles, T]`."""
    padded = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, tiles * tile - x.shape[-1])], constant_values=fill)
    return padded.reshape(x.shape[:-1] + (tiles, tile))


def _pad_states(x, axes, size):
    return jnp.pad(x, [(0, size - x.shape[a]) if a in axes else (0, 0) for a in range(x.ndim)])


class _Layout(NamedTuple):
    """How a state count is tiled: `tile` patterns per program, states padded to `states`."""

    blocks: bool
    tile: int
    states: int

    @classmethod
    def of(cls, states: int) -> "_Layout":
        if blocked(states):
            padded = padded_states(states)
            return cls(True, BLOCK_ELEMENTS // padded, padded)
        return cls(False, PATTERN_TILE, states)

    def tip_tiles(self, tip_codes, tip_table, dtype):
        """Tips' vectors `[N+1, tiles, S, T]`, or blocks `[N+1, tiles, T, S]`; padding patterns are all ones."""
        tiles = -(-tip_codes.shape[1] // self.tile)
        table = _pad_states(tip_table.astype(dtype), (1,), self.states)
        tips = _tiled(jnp.moveaxis(table[tip_codes], -1, -2), tiles, self.tile, 1.0)  # [N+1, S, tiles, T]
        return jnp.moveaxis(tips, -2, 1).swapaxes(-1, -2) if self.blocks else jnp.moveaxis(tips, -2, 1)

    def row_shape(self, categories: int) -> tuple[int, int, int]:
        return (categories, self.tile, self.states) if self.blocks else (categories, self.states, self.tile)


class TiledPartials(NamedTuple):
    """Post-order output in the kernels' layout: partials `[B, rows, tiles, C, S, T]` (blocks: `[..., C, T, S]`),
    log scales `[B, rows, tiles, T]`, the root's category sums `[B, tiles, T]`, and the tips' vectors the
    pre-order pass reads again."""

    partials: Array
    log_scales: Array
    root_sums: Array
    tips: Array


def post_order_tiled(transition: Float[Array, "B ids C S S"], root_frequencies: Float[Array, "B S"],
                     category_weights: Float[Array, "B C"], tip_codes: Int[Array, "tips_plus_one patterns"],
                     tip_table: Float[Array, "codes S"], schedule: Schedule, static_steps=None,
                     interpret: bool | None = None) -> TiledPartials:
    """The post-order pass in the kernels' tiled layout: one launch per step, or one walk for small trees."""

    b, _, c, s, _ = transition.shape
    layout, interpret = _Layout.of(s), _interpret(interpret)
    transition = _pad_states(transition, (3, 4), layout.states)
    root_frequencies = _pad_states(root_frequencies.astype(transition.dtype), (1,), layout.states)
    tips = layout.tip_tiles(tip_codes, tip_table, transition.dtype)
    tiles, rows = tips.shape[1], schedule.num_slots + 1
    carry = (jnp.ones((b, rows, tiles) + layout.row_shape(c), transition.dtype),
             jnp.zeros((b, rows, tiles, layout.tile), transition.dtype),
             jnp.zeros((b, tiles, layout.tile), transition.dtype))
    nodes = _pallas_blocks if layout.blocks else _pallas_vectors
    call = functools.partial(
        _call, consts=(schedule.num_tips, rows - 1, c, s, interpret),
        inputs=("start", "root_row", "children", "transition", "frequencies", "weights", "tips", "partials",
                "log_scales", "root_sums"),
        outputs=dict(partials=_shape(carry[0]), log_scales=_shape(carry[1]), root_sums=_shape(carry[2])),
        aliases={7: 0, 8: 1, 9: 2}, interpret=interpret)
    arguments = (schedule.root_row.astype(jnp.int32), schedule.children.astype(jnp.int32), transition,
                 root_frequencies, category_weights.astype(transition.dtype), tips)
    if walks(schedule.num_tips, s):
        walk = call(nodes.post_order_walk, grid=(b, tiles), name="post_order_walk")
        partials, log_scales, root_sums = walk(jnp.zeros(b, jnp.int32), *arguments, *carry)
    else:
        def body(carry, start, real, width):
            step = call(nodes.post_order_step, grid=(b, width, tiles), name=f"post_order_w{width}")
            return step(start.astype(jnp.int32), *arguments, *carry)

        partials, log_scales, root_sums = level_loop(schedule, body, carry, static_steps=static_steps)
    return TiledPartials(partials, log_scales, root_sums, tips)


def untiled(x: Float[Array, "*lead tiles C S T"], patterns: int, states: int) -> Float[Array, "*lead C patterns S"]:
    """Tiled partials back in the passes' layout `[..., C, patterns, S]`."""
    if not blocked(states):
        x = x.swapaxes(-1, -2)
    *lead, tiles, c, t, s = x.shape
    return jnp.moveaxis(x, -4, -3).reshape(*lead, c, tiles * t, s)[..., :patterns, :states]


def post_order_partials(
    transition: Float[Array, "B ids C S S"],
    tip_codes: Int[Array, "tips_plus_one patterns"],
    tip_table: Float[Array, "codes S"],
    schedule: Schedule,
    static_steps=None,
    interpret: bool | None = None,
) -> tuple[Float[Array, "B rows C patterns S"], Float[Array, "B rows patterns"]]:
    """`_peeling.post_order_partials` through the Pallas step (same outputs, same layout)."""
    b, _, c, s, _ = transition.shape
    uniform = jnp.ones((b, s), transition.dtype) / s, jnp.ones((b, c), transition.dtype) / c  # root sums unused
    tiled = post_order_tiled(transition, *uniform, tip_codes, tip_table, schedule, static_steps, interpret)
    patterns = tip_codes.shape[1]
    rows = tiled.log_scales.shape[1]
    return untiled(tiled.partials, patterns, s), tiled.log_scales.reshape(b, rows, -1)[..., :patterns]


def root_partials(tiled: TiledPartials, schedule: Schedule, patterns: int, states: int) -> Float[Array, "B C patterns S"]:
    return untiled(take_per_tree(tiled.partials, schedule.root_row), patterns, states)


def root_sums(tiled: TiledPartials, patterns: int) -> Float[Array, "B patterns"]:
    """`sum_r w_r pi^T p_root,r` per pattern, on the rescaled root partials."""
    return tiled.root_sums.reshape(tiled.root_sums.shape[0], -1)[:, :patterns]


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
    """`sum_c g_c d log L_c / d P` for every branch: the pre-order pass, each step one Pallas launch (or one
    walk for small trees), starting from `q_root,r = w_r pi`.

    Vectors: each program adds its tile's `sum_c g_c s_i,c p_i,c^T / n_c` into
    row k's slot of a `[B, rows, tiles, 2, C, S, S]` buffer (no two programs
    share a slot); the tiles are summed and scattered to the branches once, at
    the end. Blocks: each step's kernel writes `s`, `p` and `g_c / n_c`, and
    a batched matrix product contracts them over patterns.
    """

    b, rows, tiles = tiled.partials.shape[:3]
    c, s = transition.shape[2], transition.shape[-1]
    layout, interpret = _Layout.of(s), _interpret(interpret)
    transition = _pad_states(transition, (3, 4), layout.states)
    root = category_weights[:, :, None] * _pad_states(root_frequencies, (1,), layout.states)[:, None, :]  # [B, C, S]
    root = root[:, None, :, None, :] if layout.blocks else root[:, None, :, :, None]
    q = jnp.ones(tiled.partials.shape, transition.dtype)
    q = set_per_tree(q, schedule.root_row, jnp.broadcast_to(root, (b,) + tiled.partials.shape[2:]))
    cotangent = _tiled(pattern_cotangent.astype(transition.dtype), tiles, layout.tile, 0.0)
    inputs = ("start", "real", "root_row", "children", "transition", "tips", "partials", "cotangent", "q")
    arguments = (schedule.root_row.astype(jnp.int32), schedule.children.astype(jnp.int32), transition,
                 tiled.tips, tiled.partials, cotangent)
    call = functools.partial(_call, consts=(schedule.num_tips, rows - 1, c, s, interpret), interpret=interpret)
    if layout.blocks:
        return _block_cotangents(call, inputs, arguments, q, schedule, static_steps)[..., :s, :s]

    d = jnp.zeros((b, rows, tiles, 2, c, s, s), transition.dtype)
    call = functools.partial(call, inputs=inputs + ("d",), outputs=dict(q=_shape(q), d=_shape(d)),
                             aliases={8: 0, 9: 1})
    nodes = _pallas_vectors
    if walks(schedule.num_tips, s):
        walk = call(nodes.pre_order_walk, grid=(b, tiles), name="pre_order_walk")
        _, d = walk(jnp.zeros(b, jnp.int32), jnp.ones(b, jnp.int32), *arguments, q, d)
    else:
        def body(carry, start, real, width):
            step = call(nodes.pre_order_step, grid=(b, width, tiles), name=f"pre_order_w{width}")
            return step(start.astype(jnp.int32), real.astype(jnp.int32), *arguments, *carry)

        _, d = level_loop(schedule, body, (q, d), reverse=True, static_steps=static_steps)
    per_row = jnp.sum(d[:, :-1], axis=2)  # [B, slots, 2, C, S, S]
    children = schedule.children
    return add_per_tree(jnp.zeros_like(transition), children, per_row)


def _block_cotangents(call, inputs, arguments, q, schedule: Schedule, static_steps):
    """The blocks' pre-order pass: per step, the kernel's `s`, `p` and `g_c / n_c`, contracted over patterns
    into `sum_c (g_c / n_c) s_c p_c^T` for both children of every node of the step."""

    transition = arguments[2]
    b, _, tiles, c, tile, s = q.shape

    def body(carry, start, real, width):
        q, d = carry
        pairs = jax.ShapeDtypeStruct((b, width, 2, tiles, c, tile, s), q.dtype)
        step = call(_pallas_blocks.pre_order_step, inputs=inputs,
                    outputs=dict(q=_shape(q), s=pairs, p=pairs,
                                 alpha=jax.ShapeDtypeStruct((b, width, tiles, tile), q.dtype)),
                    aliases={8: 0}, grid=(b, width, tiles), name=f"pre_order_w{width}")
        q, s_pairs, p_pairs, alpha = step(start.astype(jnp.int32), real.astype(jnp.int32), *arguments, q)
        contribution = jnp.einsum("bwktcpi,bwtp,bwktcpj->bwkcij", s_pairs, alpha, p_pairs,
                                  precision=product_precision())
        return q, add_per_tree(d, step_children(schedule, start, width), contribution)

    _, d = level_loop(schedule, body, (q, jnp.zeros_like(transition)), reverse=True, static_steps=static_steps)
    return d


def update_tile(patterns: int) -> int:
    """Patterns per program of `update_partials`: `PATTERN_TILE`, or the largest power of two in `patterns`."""
    return min(PATTERN_TILE, 1 << (patterns.bit_length() - 1))


def update_warps(tile: int) -> int:
    """Warps of a program whose vectors are `[tile]`: one thread per pattern (at most `NUM_WARPS`). The kept
    partials' programs read back rows they wrote with no barrier, which is safe only where each pattern is
    held by one thread; with more threads than patterns Triton would hold copies in other warps, which read
    what one copy stored. Under 32 patterns the copies share one warp."""
    return max(1, min(NUM_WARPS, tile // 32))


def update_partials(transition, tip_codes, tip_table, partials, log_scales, buffer, children, operations, counts,
                    root, root_frequencies, category_weights, interpret: bool | None = None):
    """`_update.update_partials` as one launch: grid `(chains, pattern tiles)`, each program walking its chain's
    operation list (`_pallas_vectors.update_walk`) in the samplers' own layout; nucleotides and other state
    spaces of up to `VECTOR_STATES`. The root's `log L_c` is then read as `_update` reads it."""
    b, _, _, c, patterns, s = partials.shape
    num_tips, tile, interpret = tip_codes.shape[0] - 1, update_tile(patterns), _interpret(interpret)
    tips = tip_table.astype(partials.dtype)[tip_codes]  # [N + 1, patterns, S]
    walk = _call(_pallas_vectors.update_walk, consts=(num_tips, c, s, patterns, tile),
                 inputs=("operations", "counts", "children", "buffer", "transition", "tips", "partials", "log_scales"),
                 outputs=dict(partials=_shape(partials), log_scales=_shape(log_scales)), aliases={6: 0, 7: 1},
                 grid=(b, -(-patterns // tile)), interpret=interpret, name="update_walk", num_warps=update_warps(tile))
    partials, log_scales = walk(operations.astype(jnp.int32), counts.astype(jnp.int32), children.astype(jnp.int32),
                                buffer.astype(jnp.int32), transition, tips, partials, log_scales)
    return partials, log_scales, _update.kept_log_likelihoods(partials, log_scales, buffer, root, root_frequencies,
                                                              category_weights, num_tips)


LEVEL_WIDTH = 2  # nodes per chain and launch: a move's dirty set is one or two paths to the root


def update_levels(transition, tip_codes, tip_table, partials, log_scales, buffer, children, operations, counts,
                  depths, root, root_frequencies, category_weights, interpret: bool | None = None,
                  width: int = LEVEL_WIDTH):
    """`update_partials` with one launch per dirty level instead of one walk: grid `(chains, width, pattern
    tiles)`, launch `l` computing `_update.level_row` `l` of the lists' `level_schedule` (every chain's dirty nodes
    of one depth, up to `width` of them; `_pallas_vectors.update_level`), in a loop over the levels any chain has
    dirty."""
    b, _, _, c, patterns, s = partials.shape
    num_tips, tile, interpret = tip_codes.shape[0] - 1, update_tile(patterns), _interpret(interpret)
    tips = tip_table.astype(partials.dtype)[tip_codes]
    operations = operations.astype(jnp.int32)
    launch, slot, launches = _update.level_schedule(counts, depths, width)
    level = _call(_pallas_vectors.update_level, consts=(num_tips, c, s, patterns, tile),
                  inputs=("operations", "children", "buffer", "transition", "tips", "partials", "log_scales"),
                  outputs=dict(partials=_shape(partials), log_scales=_shape(log_scales)), aliases={5: 0, 6: 1},
                  grid=(b, width, -(-patterns // tile)), interpret=interpret, name=f"update_level_w{width}",
                  num_warps=update_warps(tile))
    children, buffer = children.astype(jnp.int32), buffer.astype(jnp.int32)
    partials, log_scales = lax.fori_loop(
        0, launches, lambda i, carry: level(_update.level_row(operations, launch, slot, i, width), children, buffer,
                                            transition, tips, *carry),
        (partials, log_scales))
    return partials, log_scales, _update.kept_log_likelihoods(partials, log_scales, buffer, root, root_frequencies,
                                                              category_weights, num_tips)


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def fused_generations(left: Float[Array, "B S S"], values: Float[Array, "B S"], right: Float[Array, "B S S"],
                      rates: Float[Array, "B C"], category_weights: Float[Array, "B C"],
                      root_frequencies: Float[Array, "B S"], tip_codes: Int[Array, "tips_plus_one patterns"],
                      tip_table: Float[Array, "codes S"], pattern_weights: Float[Array, " patterns"],
                      parents: Int[Array, "B M"], lengths: Float[Array, "B M"],
                      partials: Float[Array, "B 2 I C patterns S"], log_scales: Float[Array, "B 2 I patterns"],
                      buffer: Int[Array, "B I"], log_likelihood: Float[Array, " B"], beta: Float[Array, " B"],
                      kinds: Int[Array, "B G"], edges: Int[Array, "B G"], sides: Int[Array, "B G"],
                      log_multipliers: Float[Array, "B G"], log_uniforms: Float[Array, "B G"], branch_rate: float,
                      interpret: bool | None = None):
    """`G` generations of every chain in one launch (`_pallas_vectors.fused_generations`: each a branch multiplier
    or, where `kinds` is 1, a stochastic NNI): grid `(chains,)`, the kept partials of `_update` updated in place.
    `P_r(t) = left diag(exp(values r_c t)) right` is the model's spectral form. Returns `(parents, lengths,
    partials, log_scales, buffer, log L, accepted [B, 2])` (accepted multipliers, accepted NNIs)."""
    b, _, _, c, patterns, s = partials.shape
    m, internal = parents.shape[1], buffer.shape[1]
    num_tips, tile, interpret = tip_codes.shape[0] - 1, update_tile(patterns), _interpret(interpret)
    tiles = -(-patterns // tile)
    dtype = partials.dtype
    starts = jnp.minimum(jnp.arange(tiles) * tile, patterns - tile)
    columns = starts[:, None] + jnp.arange(tile)[None, :]
    first = (columns >= (jnp.arange(tiles) * tile)[:, None])  # the last tile's overlap is counted by its neighbour
    weights = jnp.where(first, jnp.asarray(pattern_weights, lengths.dtype)[columns], 0.0)
    wide, deep = _next_power_of_two(m), _next_power_of_two(internal)  # Triton's vectors: powers of two
    pad = lambda x, size, fill: jnp.pad(x, ((0, 0), (0, size - x.shape[1])), constant_values=fill)  # noqa: E731
    children = jax.vmap(kernel_children)(parents).astype(jnp.int32)
    real = lengths.dtype  # lengths, log L and the accept rule keep the chains' precision; P and partials `dtype`
    tree = (pad(parents.astype(jnp.int32), wide, -1), pad(children[..., 0], wide, 0), pad(children[..., 1], wide, 0),
            pad(lengths, wide, 0.0))
    padded_buffer = pad(buffer.astype(jnp.int32), deep, 0)
    call = _call(
        _pallas_vectors.fused_generations,
        consts=(num_tips, c, s, patterns, tile, tiles, edges.shape[1], float(branch_rate)),
        inputs=("left", "values", "right", "rates", "weights", "frequencies", "tips", "pattern_weights", "root",
                "beta", "kinds", "edges", "sides", "log_multipliers", "log_uniforms", "parents", "first", "second",
                "lengths", "partials", "log_scales", "buffer", "log_likelihood"),
        outputs=dict(parents=_shape(tree[0]), first=_shape(tree[1]), second=_shape(tree[2]),
                     lengths=_shape(tree[3]), partials=_shape(partials), log_scales=_shape(log_scales),
                     buffer=_shape(padded_buffer), log_likelihood=jax.ShapeDtypeStruct((b,), real),
                     accepted=jax.ShapeDtypeStruct((b, 2), jnp.int32)),
        aliases={15 + i: i for i in range(8)}, grid=(b,), interpret=interpret, name="fused_generations",
        num_warps=update_warps(tile))
    cast = lambda x, to=dtype: jnp.asarray(x, to)  # noqa: E731
    integer = lambda x: jnp.asarray(x, jnp.int32)  # noqa: E731
    root = jnp.argmin(parents, axis=1).astype(jnp.int32)
    out = call(cast(left), cast(values), cast(right), cast(rates), cast(category_weights), cast(root_frequencies),
               tip_table.astype(dtype)[tip_codes], weights, root, cast(beta, real), integer(kinds), integer(edges),
               integer(sides), cast(log_multipliers, real), cast(log_uniforms, real), *tree, partials, log_scales,
               padded_buffer, cast(log_likelihood, real))
    new_parents, _, _, new_lengths, partials, log_scales, new_buffer, log_likelihood, accepted = out
    return (new_parents[:, :m].astype(parents.dtype), new_lengths[:, :m], partials, log_scales,
            new_buffer[:, :internal].astype(buffer.dtype), log_likelihood, accepted)
