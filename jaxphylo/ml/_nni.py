"""Every nearest-neighbour interchange of a batch of trees, scored at once from the current partials.

Trees are kernel trees rooted on tip 0 (`jaxphylo.tree`, kernel form). An internal edge is the
branch above an internal node `v` (children `a`, `b`) whose parent `u` is not
the root (`s` is `v`'s sibling). With `m_x = P_x p_x` the message of subtree
`x` and `q_u` the pre-order partial of `u` (everything outside `u`'s subtree,
weighted by `w_r pi` at the root), the three arrangements of the edge are,
per rate category and pattern,

    current  n_0(t) = sum_x q_u m_s (x) [P(t) (m_a o m_b)](x)
    a <-> s  n_1(t) = sum_x q_u m_a (x) [P(t) (m_s o m_b)](x)
    b <-> s  n_2(t) = sum_x q_u m_b (x) [P(t) (m_a o m_s)](x)

All three use the same rescaled vectors, so the scale factors cancel and
`log L_i - log L_0 = sum_c w_c (log n_i,c - log n_0,c)` exactly. The central
branch `t` of each is fitted by Newton's method on the eigen-expansion
`n(t) = sum_r sum_k g_rk exp(lam_k rho_r t)`, with `g = (U^T (A / sqrt(pi))) o (U^T (B sqrt(pi)))`
for upper and lower vectors `A`, `B`: each step costs one pass over the
`[categories, patterns, states]` coefficients, and every candidate of every
tree is one vmapped array operation.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from ..runtime import product_precision, set_per_tree, take_per_tree
from ..tree import device_schedule, kernel_children, mask_like
from ..likelihood import batch_layout_lengths, group_kernel_arrays, kernel_arrays, part_layout_lengths
from ..likelihood.kernels import (
    apply_transition,
    child_partials,
    gather_rows,
    level_loop,
    log_likelihoods_from,
    post_order_partials,
    pre_order_partials,
    step_children,
    write_rows,
)
from ..models import MAX_LENGTH, MIN_LENGTH, PartitionedModel

NEWTON_STEPS = 10
CHUNK_BYTES = 1 << 28  # per chunk of edges scored together


class TreePartials(eqx.Module):
    """Post- and pre-order partials of a batch of kernel trees, addressed by kernel node."""

    transition: Float[Array, "B ids C S S"]
    post: Float[Array, "B rows C P S"]
    pre: Float[Array, "B rows C P S"]
    codes: Int[Array, "tips_plus_one P"]
    table: Float[Array, "codes S"]
    ids: Int[Array, "B nodes"]
    frequencies: Float[Array, "B S"]
    category_weights: Float[Array, "B C"]
    subtree_scales: Float[Array, "B rows P"]  # the log factors `post` was divided by, summed over each subtree
    log_likelihoods: Float[Array, "B P"]  # `log L_c` of the tree
    num_tips: int = eqx.field(static=True)

    @staticmethod
    def build(arrays, schedule, parents: Int[Array, "B M"]) -> "TreePartials":
        """From the kernels' input `(P, pi, w, tip codes, tip table)` on the device schedule of `parents`."""
        transition, pi, category_weights, codes, table = arrays
        post, log_scales = post_order_partials(transition, codes, table, schedule)
        pre, _ = pre_order_partials(transition, pi, category_weights, post, codes, table, schedule)
        batch, m = parents.shape
        ids = jnp.arange(schedule.layout.shape[1], dtype=jnp.int32)
        ids = set_per_tree(jnp.zeros((batch, m + 1), jnp.int32), schedule.layout,
                           jnp.broadcast_to(ids, schedule.layout.shape))
        log_l = log_likelihoods_from(post, log_scales, pi, category_weights, schedule)
        return TreePartials(transition, post, pre, codes, table, ids, pi, category_weights,
                            subtree_log_scales(log_scales, schedule), log_l, (m + 1) // 2)

    def _id(self, nodes):
        return jnp.take_along_axis(self.ids, nodes.reshape(nodes.shape[0], -1), axis=1).reshape(nodes.shape)

    def partial(self, nodes: Int[Array, "B K"]) -> Float[Array, "B K C P S"]:
        """`p` of each node (a tip's 0/1 rows, broadcast over categories)."""
        p = child_partials(self._id(nodes)[..., None], self.post, self.codes, self.table)[:, :, 0]
        return jnp.broadcast_to(p, nodes.shape + self.post.shape[2:])

    def message(self, nodes: Int[Array, "B K"]) -> Float[Array, "B K C P S"]:
        """`P_x p_x`: what the subtree below each node says about the node's parent."""
        matrices = take_per_tree(self.transition, self._id(nodes))
        return apply_transition(matrices, self.partial(nodes))

    def upper(self, nodes: Int[Array, "B K"]) -> Float[Array, "B K C P S"]:
        """`q` of internal nodes: everything outside the node's subtree, at the node."""
        rows = self._id(nodes) - self.num_tips
        return take_per_tree(self.pre, rows)

    def scale(self, nodes: Int[Array, "B K"]) -> Float[Array, "B K P"]:
        """`log` of what `p` of each node was divided by (zero at tips)."""
        ids = self._id(nodes)
        rows = jnp.where(ids >= self.num_tips, ids - self.num_tips, self.subtree_scales.shape[1] - 1)
        return take_per_tree(self.subtree_scales, rows)


def subtree_log_scales(log_scales: Float[Array, "B rows P"], schedule) -> Float[Array, "B rows P"]:
    """Every slot's log scale factor plus those of all slots below it (its subtree's), in one post-order pass.

    A tip's is zero (tips map to the sentinel row, which stays zero); so are padding slots'.
    """
    num_tips = schedule.num_tips

    def body(total, start, real, width):
        children = step_children(schedule, start, width)
        rows = jnp.where(children >= num_tips, children - num_tips, total.shape[1] - 1)
        below = take_per_tree(total, rows)
        return write_rows(total, gather_rows(log_scales, start, width) + jnp.sum(below, axis=2), start)

    return level_loop(schedule, body, jnp.zeros_like(log_scales))


class EigenSystem(eqx.Module):
    """`Q = D^-1/2 U diag(lam) U^T D^1/2` (`root` = `sqrt(pi)`), and every category's rate times the part's."""

    values: Float[Array, " S"]
    vectors: Float[Array, "S S"]
    root: Float[Array, " S"]
    rates: Float[Array, " C"]


def eigen_system(model, rate=1.0) -> EigenSystem:
    sym, root = model.substitution.symmetric_form()
    lam, u = jnp.linalg.eigh(0.5 * (sym + sym.T))
    return EigenSystem(lam, u, root, rate * model.rate_categories()[0])


def eigen_coefficients(eigen: EigenSystem, upper, lower):
    """`g[..., c, p, k]` with `n(t) = sum_c,k g exp(lam_k rho_c t)` = `sum_x upper (P(t) lower)`, and `lam rho`."""
    project = lambda x: jnp.einsum("...s,sk->...k", x, eigen.vectors.astype(x.dtype), precision=product_precision())
    g = project(upper / eigen.root.astype(upper.dtype)) * project(lower * eigen.root.astype(lower.dtype))
    return g, (eigen.rates[:, None] * eigen.values[None, :]).astype(g.dtype)


class PartSource(eqx.Module):
    """One evaluation group: partials, eigensystems and pattern weights with a leading part axis `[K_g]`.

    An unpartitioned model is one group of one part; a `PartitionedModel` has a
    group per (states, categories), its parts' lengths scaled by their rates.
    """

    partials: TreePartials
    eigen: EigenSystem
    weights: Float[Array, "parts B P"]
    parts: tuple[int, ...] = eqx.field(static=True, default=(0,))  # the model's part indices, in this order


def part_sources(parents, lengths: Float[Array, "B M *K"], model, data, weights: Float[Array, "B P"], widths,
                 dtype) -> list[PartSource]:
    schedule = device_schedule(parents, widths)
    build = jax.vmap(lambda *arrays: TreePartials.build(arrays, schedule, parents))
    if not isinstance(model, PartitionedModel):
        arrays = kernel_arrays(model, batch_layout_lengths(lengths, schedule), data, dtype)
        return [PartSource(build(*(x[None] for x in arrays)), jax.tree.map(lambda x: x[None], eigen_system(model)),
                           weights[None])]
    rates, layout, sources = model.normalised_rates(), part_layout_lengths(model, lengths, schedule), []
    for group, part_weights in zip(data.groups, data.group_weights(weights)):
        eigen = jax.tree.map(lambda *x: jnp.stack(x), *[eigen_system(model.models[k], rates[k]) for k in group.parts])
        sources.append(PartSource(build(*group_kernel_arrays(model.models, group, layout, dtype)), eigen,
                                  part_weights, tuple(group.parts)))
    return sources


def _per_part(terms, t, how):
    """`how(g, exponents, weights, t)` of every part of every group in `terms` (`(g, e, w)` per group), `t`
    shared by all parts, or (a list, one `[K_g, ...]` per group) each part's own: `[K_g, ...]` per group."""
    if isinstance(t, list):
        return [jax.vmap(how)(g, e, w, t_g) for (g, e, w), t_g in zip(terms, t)]
    return [jax.vmap(how, in_axes=(0, 0, 0, None))(g, e, w, t) for g, e, w in terms]


def _summed(terms, t, how):
    """`_per_part`, summed over every part."""
    return jax.tree.map(lambda *x: sum(jnp.sum(y, axis=0) for y in x), *_per_part(terms, t, how))


def branch_value_and_slopes(g: Float[Array, "*K C P S"], exponents: Float[Array, "C S"],
                            weights: Float[Array, "*K P"], t: Float[Array, "*K"]):
    """`f(t) = sum_p w_p log n_p(t)`, `n_p(t) = sum_c,k g exp(e t)`, and its first two derivatives in `t`."""
    e = jnp.exp(exponents * t[..., None, None])  # [*K, C, S]: small, so g is read once per derivative order
    powers = jnp.stack([e, e * exponents, e * exponents**2], axis=-3)
    n, n1, n2 = jnp.moveaxis(jnp.einsum("...cpk,...jck->...jp", g, powers, precision=product_precision()), -2, 0)
    n = jnp.maximum(n, 1e-300)
    n1, n2 = n1 / n, n2 / n
    return jnp.sum(weights * jnp.log(n), -1), jnp.sum(weights * n1, -1), jnp.sum(weights * (n2 - n1 * n1), -1)


def branch_newton(terms, t0: Float[Array, "*K"], steps: int = NEWTON_STEPS):
    """Maximise `f(t)`, summed over `terms` (`_summed` of `branch_value_and_slopes`), over `t` in [1e-6, 10]
    from `t0`: `(best t, f(best t))`. Linked lengths: one `t` for every part.

    Safeguarded Newton: where `f''` is not negative the step doubles or halves
    `t` in the direction of `f'`; the best point seen is returned.
    """
    def step(_, state):
        t, best_t, best_f = state
        f, d1, d2 = _summed(terms, t, branch_value_and_slopes)
        better = f > best_f
        best_t, best_f = jnp.where(better, t, best_t), jnp.where(better, f, best_f)
        newton = t - d1 / jnp.where(d2 < 0, d2, -1.0)
        t = jnp.where(d2 < 0, newton, jnp.where(d1 > 0, 2 * t, 0.5 * t))
        return jnp.clip(t, MIN_LENGTH, MAX_LENGTH), best_t, best_f

    t0 = jnp.clip(t0, MIN_LENGTH, MAX_LENGTH)
    dtype = terms[0][0].dtype
    t, best_t, best_f = jax.lax.fori_loop(0, steps, step, (t0, t0, jnp.full(t0.shape, -jnp.inf, dtype)))
    f, _, _ = _summed(terms, t, branch_value_and_slopes)
    return jnp.where(f > best_f, t, best_t), jnp.maximum(f, best_f)


def part_branch_newton(terms, t0: list, steps: int = NEWTON_STEPS):
    """Unlinked lengths: every part's own `t` maximises its own `f_k`, from `t0` (one `[K_g, ...]` per group):
    `(best t per group, summed f(best t))`. The parts share only the topology, so their maxima add."""
    one = lambda g, e, w, t: branch_newton([(g[None], e[None], w[None])], t, steps)  # noqa: E731
    fitted = [jax.vmap(one)(g, e, w, t) for (g, e, w), t in zip(terms, t0)]
    return [t for t, _ in fitted], sum(jnp.sum(f, 0) for _, f in fitted)


class RELLScores(eqx.Module):
    """Every tree and each of its NNI neighbours scored under `R` resampled pattern counts (RELL), reduced to
    each tree's best neighbour per replicate: all that UFBoot keeps (`jaxphylo.ml._ufboot`)."""

    log_likelihood: Float[Array, " B"]  # the tree's own log L (the search's weights)
    tree: Float[Array, "B R"]  # sum_p counts_rp log L_p of the tree itself
    gain: Float[Array, "B R"]  # the best neighbour's RELL log L minus the tree's (-inf: no valid edge)
    move: Int[Array, "B R"]  # that neighbour: 2 e + j (edge `e` of `nodes`, swap `j` of `gains`)


class NNIScores(eqx.Module):
    """Per internal node `v` of each tree: its edge's nodes, and gains and fitted lengths of both swaps."""

    nodes: Int[Array, "B E 5"]  # v, u, s, a, b
    gains: Float[Array, "B E 2"]  # log L after swap a<->s, b<->s (central branch fitted), minus log L now
    lengths: Float[Array, "B E 2 *K"]  # the fitted central branch (each part's, for unlinked lengths)
    valid: Bool[Array, "B E"]
    pattern_gains: Float[Array, "B E 2 P"] | None = None  # per pattern, with `per_pattern=True`
    rell: RELLScores | None = None  # with `rell` counts


def nni_scores(parents: Int[Array, "B M"], lengths: Float[Array, "B M *K"], model, data,
               weights: Float[Array, "B P"], widths, dtype, per_pattern: bool = False,
               rell: Float[Array, "R P"] | None = None, rell_floor=-jnp.inf) -> NNIScores:
    """Score both NNIs of every internal edge of every tree in one pass over the partials.

    `per_pattern` also returns `log L_c` after each swap minus `log L_c` now, per pattern (for SH-aLRT).
    `rell` (pattern counts of `R` bootstrap replicates) also scores every tree and every neighbour under
    each replicate, `sum_p counts_rp log L_p`, keeping only each tree's best neighbour per replicate
    (`RELLScores`), reduced chunk by chunk so that no `[B, E, 2, P]` array is ever held; a neighbour whose
    log L (under `weights`) is below `rell_floor` is left out (UFBoot's cutoff).
    A `PartitionedModel` (with `PartitionedData`) scores every part and sums:
    with linked lengths the central branch is the tree's, each part's `r_k t`
    (`part_sources`); with unlinked ones (`[B, M, K]`) every part fits its own.
    """
    batch, m = parents.shape
    n = (m + 1) // 2
    sources = part_sources(parents, lengths, model, data, weights, widths, dtype)
    kids = jax.vmap(kernel_children)(parents)
    v = jnp.broadcast_to(jnp.arange(n, m, dtype=parents.dtype), (batch, m - n))
    u = jnp.take_along_axis(parents, v, axis=1)
    root = jnp.argmin(parents, axis=1).astype(parents.dtype)[:, None]
    valid = (u >= 0) & (u != root)
    u = jnp.where(valid, u, root)
    a, b = (jnp.take_along_axis(kids[..., k], v, axis=1) for k in (0, 1))
    at_u = jnp.take_along_axis(kids, u[..., None], axis=1)
    s = jnp.where(at_u[..., 0] == v, at_u[..., 1], at_u[..., 0])
    a, b, s = (jnp.where(valid, x, 0) for x in (a, b, s))
    lengths_v = jnp.take_along_axis(lengths, mask_like(v, lengths), axis=1)  # [B, E] or [B, E, K]
    unlinked = lengths.ndim == 3

    def coefficients(partials: TreePartials, eigen: EigenSystem, u_, s_, a_, b_):
        """`(g [B, E, 3, C, P, S], exponents)` of the current arrangement and both swaps, for one part."""
        q = partials.upper(u_)
        m_a, m_b, m_s = partials.message(a_), partials.message(b_), partials.message(s_)
        upper = jnp.stack([q * m_s, q * m_a, q * m_b], axis=2)
        lower = jnp.stack([m_a * m_b, m_s * m_b, m_a * m_s], axis=2)
        return eigen_coefficients(eigen, upper, lower)

    def score(edges):
        """Fitted lengths, gains (and per-pattern gains) of one chunk of edges `[B, E]`."""
        u_, s_, a_, b_, t_now = (jnp.take_along_axis(x, mask_like(edges, x), axis=1) for x in (u, s, a, b, lengths_v))
        terms = []
        for source in sources:
            g, exponents = jax.vmap(coefficients, in_axes=(0, 0, None, None, None, None))(
                source.partials, source.eigen, u_, s_, a_, b_)
            terms.append((g, exponents, source.weights[:, :, None, None, :].astype(g.dtype)))
        swaps, current = [(g[:, :, :, 1:], e, w) for g, e, w in terms], [(g[:, :, :, :1], e, w) for g, e, w in terms]
        if unlinked:  # every part its own t: `[K_g, B, E, arrangements]` per group
            t0 = [jnp.broadcast_to(_part_rows(t_now, source)[..., None], (len(source.parts),) + t_now.shape[:2] + (3,))
                  for source in sources]
            t_swaps, f = part_branch_newton(swaps, [x[..., 1:] for x in t0])
            t0_now, t = [x[..., :1] for x in t0], _parts_last(t_swaps, sources)
        else:
            t0 = jnp.broadcast_to(t_now[..., None], t_now.shape + (3,))
            t, f = branch_newton(swaps, t0[:, :, 1:])
            t0_now, t_swaps = t0[:, :, :1], t
        now, _, _ = _summed(current, t0_now, branch_value_and_slopes)
        if not per_pattern and rell is None:
            return t, f - now, None

        def log_n(g, exponents, t):
            n = jnp.einsum("...cpk,...ck->...p", g, jnp.exp(exponents * t[..., None, None]), precision=product_precision())
            return jnp.log(jnp.maximum(n, 1e-300))

        gains = _per_part(terms, t_swaps, lambda g, e, w, t: log_n(g[:, :, 1:], e, t))
        before = _per_part(terms, t0_now, lambda g, e, w, t: log_n(g[:, :, :1], e, t))
        gains = [x - y for x, y in zip(gains, before)]  # [K_g, B, E, 2, P] each: parts side by side, as the weights
        gains = jnp.concatenate([jnp.moveaxis(x, 0, -2).reshape(x.shape[1:-1] + (-1,)) for x in gains], -1)
        if rell is None:
            return t, f - now, gains
        # The chunk's best neighbour per tree and replicate, as (gain, 2 e + j) with `e` the real edge index
        # (the last chunk repeats the last edge: a repeat ties and never wins).
        resampled = jnp.einsum("bejp,rp->brej", gains, rell.astype(gains.dtype), precision=product_precision())
        usable = jnp.take_along_axis(valid, edges, axis=1)[:, :, None] & \
            (own_log_l[:, None, None] + f - now >= rell_floor)
        usable = usable[:, None]
        resampled = jnp.where(usable, resampled, -jnp.inf).reshape(resampled.shape[:2] + (-1,))
        best = jnp.argmax(resampled, axis=-1)
        moves = (2 * edges[:, None, :, None] + jnp.arange(2)).reshape(edges.shape[0], 1, -1)
        return t, f - now, (jnp.max(resampled, axis=-1), jnp.take_along_axis(
            jnp.broadcast_to(moves, resampled.shape), best[..., None], axis=-1)[..., 0])

    # Edges in chunks, so that the `[K_g, B, E, 3, C, P, S]` coefficients stay near `CHUNK_BYTES`.
    k = m - n
    per_tree = sum(int(np.prod(source.partials.post.shape[:1] + source.partials.post.shape[3:])) for source in sources)
    edge_bytes = 3 * per_tree * 8 * batch
    chunk = max(1, min(k, CHUNK_BYTES // edge_bytes))
    chunks = -(-k // chunk)
    order = jnp.minimum(jnp.arange(chunks * chunk), k - 1).reshape(chunks, 1, chunk)
    if rell is not None:  # every tree's own per-pattern log L, the parts side by side as in the weights
        tree_patterns = jnp.concatenate([jnp.moveaxis(x.partials.log_likelihoods, 0, -2).reshape(batch, -1)
                                         for x in sources], -1)
        own_log_l = jnp.sum(weights.astype(tree_patterns.dtype) * tree_patterns, axis=-1)
    t, gains, extra = jax.lax.map(lambda e: score(jnp.broadcast_to(e, (batch, chunk))), order)
    merge = lambda x: None if x is None else jnp.moveaxis(x, 0, 1).reshape((batch, chunks * chunk) + x.shape[3:])[:, :k]
    t, gains = merge(t), merge(gains)
    pattern_gains, scored = (merge(extra), None) if rell is None else \
        (None, _rell_scores(tree_patterns, own_log_l, rell, *extra))
    return NNIScores(jnp.stack([v, u, s, a, b], axis=-1), jnp.where(valid[..., None], gains, -jnp.inf), t,
                     valid, pattern_gains, scored)


def _rell_scores(per_pattern: Float[Array, "B P"], own_log_l: Float[Array, " B"], counts: Float[Array, "R P"],
                 gains: Float[Array, "chunks B R"], moves: Int[Array, "chunks B R"]) -> RELLScores:
    """The chunks' best neighbours merged, and each tree's own RELL log L."""
    tree = jnp.einsum("bp,rp->br", per_pattern, counts.astype(per_pattern.dtype), precision=product_precision())
    best = jnp.argmax(gains, axis=0)
    return RELLScores(own_log_l, tree, jnp.max(gains, axis=0), jnp.take_along_axis(moves, best[None], axis=0)[0])


def _part_rows(x: Float[Array, "B E K"], source: PartSource) -> Float[Array, "K_g B E"]:
    """A group's parts of per-part values, part axis first."""
    return jnp.moveaxis(x[..., list(source.parts)], -1, 0)


def _parts_last(per_group: list, sources: list[PartSource]) -> Float[Array, "B E two K"]:
    """Per-group values `[K_g, ...]` back to one array with the model's parts last, in order."""
    rows = {k: x[j] for source, x in zip(sources, per_group) for j, k in enumerate(source.parts)}
    return jnp.stack([rows[k] for k in sorted(rows)], -1)


def independent_moves(priority: Float[Array, "B K"], nodes: Int[Array, "B K J"], num_nodes: int) -> Bool[Array, "B K"]:
    """Greedily take moves in order of `priority` (only positive ones) whose nodes no taken move touches."""

    def one_tree(priority, nodes):
        order = jnp.argsort(-priority)

        def take(i, state):
            used, chosen = state
            k = order[i]
            ok = (priority[k] > 0) & ~jnp.any(used[nodes[k]])
            return used.at[nodes[k]].set(used[nodes[k]] | ok), chosen.at[k].set(ok)

        used = jnp.zeros(num_nodes, bool)
        return jax.lax.fori_loop(0, priority.shape[0], take, (used, jnp.zeros(priority.shape, bool)))[1]

    return jax.vmap(one_tree)(priority, nodes)


def apply_nnis(parents, lengths, scores: NNIScores, chosen: Bool[Array, "B K"], which: Int[Array, "B K"]):
    """Swap `a` (which 0) or `b` (which 1) with `s` on every chosen edge; the central branch takes its fitted length."""
    batch, m = parents.shape
    v, u, s, a, b = (scores.nodes[..., i] for i in range(5))
    x = jnp.where(which == 0, a, b)
    drop = lambda nodes: jnp.where(chosen, nodes, m)
    parents = set_per_tree(set_per_tree(parents, drop(x), u, mode="drop"), drop(s), v, mode="drop")
    fitted = jnp.take_along_axis(scores.lengths, mask_like(which[..., None], scores.lengths), axis=2)[:, :, 0]
    lengths = set_per_tree(lengths, drop(v), fitted, mode="drop")  # [B, E] or, unlinked, [B, E, K]
    return parents, lengths
