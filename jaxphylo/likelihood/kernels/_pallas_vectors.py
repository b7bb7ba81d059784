"""Pallas node bodies for small state spaces (nucleotides): each state of a pattern tile is one `[T]` vector.

Triton wants every array of a kernel to have a power-of-two size and handles
long flat vectors best, so for `S <= VECTOR_STATES` a tile of a partials row is
kept as `C x S` vectors of `T` patterns (buffers `[B, rows, tiles, C, S, T]`),
and `P x` is written out as `S^2` multiply-adds of tile vectors by scalars.
Every category of a node stays in registers, so a node is computed once and
rescaled in place. `_pallas.py` runs these bodies as step launches or walks.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

VECTOR_STATES = 8  # up to this many states `P x` is written out; above it `_pallas_blocks` uses matrix products


def _child_vectors(b, t, child, num_tips, sentinel_row, num_categories, num_states, tips_ref, partials_ref):
    """`x[r][j]`, the `[T]` tile of a child's partials in category r and state j (a tip's from its codes)."""
    is_tip = child < num_tips
    tip_row = jnp.where(is_tip, child, num_tips)
    source = jnp.where(is_tip, sentinel_row, child - num_tips)
    tip = [tips_ref[tip_row, t, j, :] for j in range(num_states)]
    return [[jnp.where(is_tip, tip[j], partials_ref[b, source, t, r, j, :]) for j in range(num_states)]
            for r in range(num_categories)]


def _times(transition_ref, b, child, r, x, transpose=False):
    """`P x` (or `P^T x`) of category r's matrix of `child`'s branch, each state a `[T]` vector."""
    if transpose:
        return _product(lambda i, j: transition_ref[b, child, r, j, i], x)
    return _product(lambda i, j: transition_ref[b, child, r, i, j], x)


def _product(entry, x):
    """`P x` for `P`'s entries `entry(i, j)` (scalars) and `x` a list of `[T]` vectors, written out."""
    n = len(x)
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


def _post_order_node(b, row, t, consts, refs):
    """Row `row` of tree b, pattern tile t: `p_k = (P_i x_i) o (P_j x_j)`, rescaled, and its log factor; at
    the root also `sum_r w_r pi^T p_root,r`, the category sum."""
    num_tips, sentinel_row, num_categories, num_states, _ = consts
    products = None
    for k in range(2):
        child = refs.children[b, row, k]
        x = _child_vectors(b, t, child, *consts[:4], refs.tips, refs.partials)
        messages = [_times(refs.transition, b, child, r, x[r]) for r in range(num_categories)]
        products = messages if k == 0 else [[p * m for p, m in zip(ps, ms)] for ps, ms in zip(products, messages)]
    scale = _tile_max(products)
    scaled = [[x / scale for x in per_state] for per_state in products]
    for r in range(num_categories):
        for i in range(num_states):
            refs.partials[b, row, t, r, i, :] = scaled[r][i]
    refs.log_scales[b, row, t, :] = jnp.log(scale)

    @pl.when(row == refs.root_row[b])
    def _():
        refs.root_sums[b, t, :] = sum(refs.weights[b, r] * refs.frequencies[b, i] * scaled[r][i]
                                      for r in range(num_categories) for i in range(num_states))


def _pre_order_node(b, row, t, real, consts, refs):
    """Row `row` as a parent: `s_i = q_k o P_j p_j`, `q_i = rescale(P_i^T s_i)` for internal children, and
    `sum_c g_c s_i,c p_i,c^T / n_c` over the tile added to the row's `[2, C, S, S]` slot of `refs.d`."""
    num_tips, sentinel_row, num_categories, num_states, _ = consts
    parent = [[refs.q[b, row, t, r, i, :] for i in range(num_states)] for r in range(num_categories)]
    children = [refs.children[b, row, k] for k in range(2)]
    p = [_child_vectors(b, t, child, *consts[:4], refs.tips, refs.partials) for child in children]
    messages = [[_times(refs.transition, b, child, r, p[k][r]) for r in range(num_categories)]
                for k, child in enumerate(children)]
    s = [[[q * m for q, m in zip(parent[r], messages[1 - k][r])] for r in range(num_categories)] for k in range(2)]
    norm = sum(a * m for r in range(num_categories) for a, m in zip(s[0][r], messages[0][r]))
    counted = (children[0] != num_tips + sentinel_row) & real
    alpha = jnp.where(counted, refs.cotangent[b, t, :] / jnp.where(counted, norm, 1.0), 0.0)
    for k, child in enumerate(children):
        for r in range(num_categories):
            weighted = [alpha * v for v in s[k][r]]
            for i in range(num_states):
                for j in range(num_states):
                    # Added, not stored: padding steps revisit the root's block (adding zeros there).
                    refs.d[b, row, t, k, r, i, j] += jnp.sum(weighted[i] * p[k][r][j])

        @pl.when((child >= num_tips) & (child != num_tips + sentinel_row))  # only internal children's q is kept
        def _(child=child, k=k):
            up = [_times(refs.transition, b, child, r, s[k][r], transpose=True) for r in range(num_categories)]
            scale = _tile_max(up)
            for r in range(num_categories):
                for j in range(num_states):
                    refs.q[b, child - num_tips, t, r, j, :] = up[r][j] / scale


def post_order_step(consts, refs):
    b, w, t = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    _post_order_node(b, refs.start[b] + w, t, consts, refs)


def post_order_walk(consts, refs):
    """Every row up to the root's, in order, for one tile: rows are in post-order, and a program reads back
    only what it wrote itself (the same `[T]` vectors, so the same threads), so levels need no launch boundary."""
    b, t = pl.program_id(0), pl.program_id(1)

    def node(row, carry):
        _post_order_node(b, row, t, consts, refs)
        return carry

    lax.fori_loop(0, refs.root_row[b] + 1, node, 0)


def pre_order_step(consts, refs):
    b, w, t = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    _pre_order_node(b, refs.start[b] + w, t, refs.real[b] != 0, consts, refs)


def pre_order_walk(consts, refs):
    b, t = pl.program_id(0), pl.program_id(1)
    root = refs.root_row[b]

    def node(i, carry):
        _pre_order_node(b, root - i, t, True, consts, refs)
        return carry

    lax.fori_loop(0, root + 1, node, 0)


def _kept_node_tile(b, cols, kids, inner, which, entry, row, to, consts, refs):
    """One pattern tile of an internal node kept by node id (the samplers' layout `[B, 2, I, C, patterns, S]`: a
    state of a tile is a strided `[T]` vector, so no copy to a tiled layout is ever made).

    Children `kids` (internal rows `inner`): a tip's vectors from `tips [N + 1, patterns, S]`, an internal
    child's row from its buffer `which[k]`; `p = (P_a x_a) o (P_b x_b)` with `P`'s entries `entry(k, r, i, j)`,
    rescaled by the power of two `2^e` of its tile maximum (as `rescale_by_power_of_two`: exact) into buffer
    `to` of row `row`, and `e log 2` plus the internal children's subtree sums as its log scale row.
    """
    num_tips, num_categories, num_states = consts[:3]
    products, below = None, None
    for k in range(2):
        is_tip = kids[k] < num_tips
        tip = [refs.tips[jnp.where(is_tip, kids[k], num_tips), cols, j] for j in range(num_states)]
        x = [[jnp.where(is_tip, tip[j], refs.partials[b, which[k], inner[k], r, cols, j]) for j in range(num_states)]
             for r in range(num_categories)]
        messages = [_product(lambda i, j, k=k, r=r: entry(k, r, i, j), x[r]) for r in range(num_categories)]
        products = messages if k == 0 else [[p * m for p, m in zip(ps, ms)] for ps, ms in zip(products, messages)]
        scales = jnp.where(is_tip, 0.0, refs.log_scales[b, which[k], inner[k], cols])
        below = scales if k == 0 else below + scales
    exponent, inverse = _power_of_two(_tile_max(products))
    for r in range(num_categories):
        for s in range(num_states):
            refs.partials[b, to, row, r, cols, s] = products[r][s] * inverse
    refs.log_scales[b, to, row, cols] = exponent.astype(below.dtype) * math.log(2.0) + below


def _inner_rows(kids, num_tips):
    """Each child's row among the internal nodes (0 for a tip, whose row is never read)."""
    return [jnp.where(kid < num_tips, 0, kid - num_tips) for kid in kids]


def _update_node(b, v, cols, consts, refs):
    """Node `v` of chain b over the pattern columns `cols` (`_update.update_partials`'s node step, by node id):
    its children's rows read from the buffers `buffer[b, row]` names, written to row `v - N` of its own
    `buffer` entry (`_kept_node_tile`)."""
    num_tips = consts[0]
    kids = [refs.children[b, v, k] for k in range(2)]
    inner = _inner_rows(kids, num_tips)
    row = v - num_tips
    _kept_node_tile(b, cols, kids, inner, [refs.buffer[b, i] for i in inner],
                    lambda k, r, i, j: refs.transition[b, kids[k], r, i, j], row, refs.buffer[b, row], consts, refs)


def _columns(t, patterns: int, tile: int):
    """Tile t's `T` pattern columns; the last tile starts at `patterns - T` and overlaps its neighbour (both
    write the same values there)."""
    return pl.ds(jnp.minimum(t * tile, patterns - tile), tile)


def update_walk(consts, refs):
    """One chain's operation list for one pattern tile: program `(b, t)` visits chain b's first `counts[b]`
    listed nodes in order (children before parents), each by `_update_node`. A clean node costs nothing; a
    program reads back only rows it wrote itself (the same vectors, so the same threads), so no launch
    boundary is needed between levels."""
    b, t = pl.program_id(0), pl.program_id(1)
    cols = _columns(t, *consts[3:5])

    def node(i, carry):
        _update_node(b, refs.operations[b, i], cols, consts, refs)
        return carry

    lax.fori_loop(0, refs.counts[b], node, 0)


def update_level(consts, refs):
    """One launch of a level schedule: program `(b, w, t)` computes node `operations[b, w]` of chain b (none
    where it is -1) for pattern tile t, by `_update_node`. The nodes of a launch are independent (one depth
    of each chain's tree); the launch boundary orders them after their children."""
    b, w, t = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    v = refs.operations[b, w]

    @pl.when(v >= 0)
    def _():
        _update_node(b, v, _columns(t, *consts[3:5]), consts, refs)


def _pick(vector, index):
    """`vector[index]` for a traced index: a masked sum (Triton cannot index a register vector)."""
    return jnp.sum(jnp.where(jnp.arange(vector.shape[0]) == index, vector, jnp.zeros_like(vector))).astype(vector.dtype)


def fused_generations(consts, refs):
    """tgMC³'s trick: `G` generations per chain in one launch, program `b` one chain, each generation a stochastic
    NNI or MrBayes's branch multiplier (`kinds[b, g]`: 1 or 0).

    Multiplier: `x' = m x` on the edge above node `edges[b, g]` (`log m = log_multipliers[b, g]`); NNI: across
    the internal edge above node `v = edges[b, g]` (below `u`), `v`'s child `sides[b, g]` and `v`'s sibling
    change places, every node keeping its edge length. The generation recomputes the path from the edge to the
    root into every path node's other buffer (`P` of each path node's children formed in the program from the
    model's spectral form, `P_r = L diag(exp(lam r t)) R`), sums the root's `log L` over the patterns
    (`pattern_weights [tiles, T]`, 0 where the last tile overlaps its neighbour), and accepts when `log u <
    beta (dlog L + dlog prior) + log q` (`log u = log_uniforms[b, g]`; Exponential(rate) edges, so `dlog prior =
    -rate (x' - x)` and `log q = log m` for the multiplier, both 0 for the NNI; `beta` the chain's heat): then
    the path's buffer indices flip and the new tree is kept, else nothing is undone. Parents, children,
    lengths, buffer indices and `log L` stay in registers between generations; a node's pattern tiles are
    visited in a loop, and each tile's rows are read back only by the threads that wrote them (the walks'
    rule), so no barrier is needed. The proposal, its dirty path, the acceptance and the next proposal never
    leave the program.
    """
    num_tips, num_categories, num_states, patterns, tile, tiles, generations, rate = consts
    b = pl.program_id(0)
    left = [[refs.left[b, i, k] for k in range(num_states)] for i in range(num_states)]
    right = [[refs.right[b, k, j] for j in range(num_states)] for k in range(num_states)]
    values = [refs.values[b, k] for k in range(num_states)]
    rates = [refs.rates[b, r] for r in range(num_categories)]
    weights = [refs.weights[b, r] for r in range(num_categories)]
    frequencies = [refs.frequencies[b, i] for i in range(num_states)]
    root, beta = refs.root[b], refs.beta[b]
    rows = jnp.arange(refs.buffer.shape[1])
    nodes = jnp.arange(refs.parents.shape[1])

    def transition(t):
        """`P_r(t)`, category by category, as `S x S` scalars."""
        out = []
        for r in range(num_categories):
            decay = [jnp.exp(values[k] * rates[r] * t) for k in range(num_states)]
            out.append([[sum(left[i][k] * decay[k] * right[k][j] for k in range(num_states))
                         for j in range(num_states)] for i in range(num_states)])
        return out

    def node(v, tree, buffer, dirty):
        """Node v's partials from its children (a dirty child's from its other buffer) into its other buffer."""
        _, first, second, lengths = tree
        kids = [_pick(first, v), _pick(second, v)]
        matrices = [transition(_pick(lengths, kid).astype(refs.partials.dtype)) for kid in kids]
        inner = _inner_rows(kids, num_tips)
        which = [jnp.where(_pick(dirty, i) > 0, 1 - _pick(buffer, i), _pick(buffer, i)) for i in inner]
        row = v - num_tips
        to = 1 - _pick(buffer, row)

        def one_tile(t, carry):
            _kept_node_tile(b, _columns(t, patterns, tile), kids, inner, which,
                            lambda k, r, i, j: matrices[k][r][i][j], row, to, consts, refs)
            return carry

        lax.fori_loop(0, tiles, one_tile, 0)
        return jnp.where(rows == row, 1, dirty)

    def log_likelihood(buffer):
        row = root - num_tips
        at = 1 - _pick(buffer, row)  # the root is on every path: its proposal is in its other buffer

        def one_tile(t, total):
            cols = _columns(t, patterns, tile)
            site = sum(weights[r] * frequencies[i] * refs.partials[b, at, row, r, cols, i]
                       for r in range(num_categories) for i in range(num_states))
            return total + jnp.sum(refs.pattern_weights[t, :] * (jnp.log(site) + refs.log_scales[b, at, row, cols]))

        return lax.fori_loop(0, tiles, one_tile, jnp.zeros((), refs.lengths.dtype))

    def nni(tree, v, side):
        """The tree with `v`'s child `side` and `v`'s sibling exchanged (v below u)."""
        parents, first, second, lengths = tree
        u = _pick(parents, v)
        x = jnp.where(side == 0, _pick(first, v), _pick(second, v))
        s = jnp.where(_pick(first, u) == v, _pick(second, u), _pick(first, u))
        swap = lambda c: jnp.where((nodes == v) & (c == x), s, jnp.where((nodes == u) & (c == s), x, c))  # noqa: E731
        parents = jnp.where(nodes == x, u, jnp.where(nodes == s, v, parents))
        return parents, swap(first), swap(second), lengths

    def generation(g, carry):
        tree, buffer, current, accepted = carry
        parents, first, second, lengths = tree
        is_nni, edge, log_m = refs.kinds[b, g] == 1, refs.edges[b, g], refs.log_multipliers[b, g]
        old = _pick(lengths, edge)
        new = jnp.where(is_nni, old, old * jnp.exp(log_m))
        scaled = (parents, first, second, jnp.where(nodes == edge, new, lengths))
        proposed = tuple(jnp.where(is_nni, a, c) for a, c in zip(nni(tree, edge, refs.sides[b, g]), scaled))
        start = jnp.where(is_nni, edge, _pick(parents, edge))
        _, dirty = lax.while_loop(lambda c: c[0] >= 0,
                                  lambda c: (_pick(proposed[0], c[0]), node(c[0], proposed, buffer, c[1])),
                                  (start, jnp.zeros_like(buffer)))
        value = log_likelihood(buffer)
        log_q = jnp.where(is_nni, 0.0, log_m)
        accept = refs.log_uniforms[b, g] < beta * (value - current - rate * (new - old)) + log_q
        buffer = jnp.where(accept & (dirty > 0), 1 - buffer, buffer)
        tree = tuple(jnp.where(accept, p, t) for p, t in zip(proposed, tree))
        accepted = (accepted[0] + (accept & ~is_nni).astype(jnp.int32),
                    accepted[1] + (accept & is_nni).astype(jnp.int32))
        return tree, buffer, jnp.where(accept, value, current), accepted

    tree = (refs.parents[b, :], refs.first[b, :], refs.second[b, :], refs.lengths[b, :])
    tree, buffer, current, (multiplied, exchanged) = lax.fori_loop(
        0, generations, generation, (tree, refs.buffer[b, :], refs.log_likelihood[b], (jnp.int32(0), jnp.int32(0))))
    refs.parents[b, :], refs.first[b, :], refs.second[b, :], refs.lengths[b, :] = tree
    refs.buffer[b, :] = buffer
    refs.log_likelihood[b] = current
    refs.accepted[b, 0] = multiplied
    refs.accepted[b, 1] = exchanged


def _power_of_two(top):
    """`(e, 2^-e)` with `top = f 2^e`, `f` in [1/2, 1), from the bits of positive normal `top` (`jnp.frexp`
    and `jnp.ldexp` go through `pow`, which Triton lowers in float32): exact, as `rescale_by_power_of_two`."""
    info = jnp.finfo(top.dtype)
    ints = jnp.int64 if info.bits == 64 else jnp.int32
    biased = lax.shift_right_logical(lax.bitcast_convert_type(top, ints), jnp.full_like(top, info.nmant, ints))
    exponent = (biased & (2 * info.maxexp - 1)) - (info.maxexp - 2)
    bits = lax.shift_left(info.maxexp - 1 - exponent, jnp.full_like(exponent, info.nmant))
    return exponent, lax.bitcast_convert_type(bits, top.dtype)
