"""Every nearest-neighbour interchange of a batch of trees, scored at once from the current partials.

Trees are kernel trees rooted on tip 0 (`_rooting`). An internal edge is the
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
from jaxtyping import Array, Bool, Float, Int

from .._precision import product_precision
from .._schedule import device_schedule, kernel_children
from ..likelihood._api import batch_layout_lengths, kernel_arrays
from ..likelihood._peeling import apply_transition, child_partials, post_order_partials
from ..likelihood._preorder import pre_order_partials
from ._parameters import MAX_LENGTH, MIN_LENGTH

NEWTON_STEPS = 10
CHUNK_BYTES = 1 << 28  # per chunk of edges scored together


class TreePartials:
    """Post- and pre-order partials of a batch of kernel trees, addressed by kernel node."""

    def __init__(self, parents, lengths, model, data, widths, dtype):
        schedule = device_schedule(parents, widths)
        arrays = kernel_arrays(model, batch_layout_lengths(lengths, schedule), data, dtype)
        self.transition, pi, category_weights, self.codes, self.table = arrays
        self.post, _ = post_order_partials(self.transition, self.codes, self.table, schedule)
        self.pre, _ = pre_order_partials(self.transition, pi, category_weights, self.post, self.codes, self.table,
                                         schedule)
        batch, m = parents.shape
        self.num_tips = (m + 1) // 2
        rows = jnp.arange(batch)[:, None]
        ids = jnp.arange(schedule.layout.shape[1], dtype=jnp.int32)
        self.ids = jnp.zeros((batch, m + 1), jnp.int32).at[rows, schedule.layout].set(ids[None])

    def _id(self, nodes):
        return jnp.take_along_axis(self.ids, nodes.reshape(nodes.shape[0], -1), axis=1).reshape(nodes.shape)

    def partial(self, nodes: Int[Array, "B K"]) -> Float[Array, "B K C P S"]:
        """`p` of each node (a tip's 0/1 rows, broadcast over categories)."""
        p = child_partials(self._id(nodes)[..., None], self.post, self.codes, self.table)[:, :, 0]
        return jnp.broadcast_to(p, nodes.shape + self.post.shape[2:])

    def message(self, nodes: Int[Array, "B K"]) -> Float[Array, "B K C P S"]:
        """`P_x p_x`: what the subtree below each node says about the node's parent."""
        matrices = jax.vmap(lambda t, k: t[k])(self.transition, self._id(nodes))
        return apply_transition(matrices, self.partial(nodes))

    def upper(self, nodes: Int[Array, "B K"]) -> Float[Array, "B K C P S"]:
        """`q` of internal nodes: everything outside the node's subtree, at the node."""
        rows = self._id(nodes) - self.num_tips
        return jax.vmap(lambda buffer, r: buffer[r])(self.pre, rows)


def eigen_coefficients(model, upper, lower):
    """`g[..., c, p, k]` with `n(t) = sum_c,k g exp(lam_k rho_c t)` = `sum_x upper (P(t) lower)`, and `lam rho`."""
    sym, root = model.substitution.symmetric_form()
    lam, u = jnp.linalg.eigh(0.5 * (sym + sym.T))
    rates, _ = model.rate_categories()
    project = lambda x: jnp.einsum("...s,sk->...k", x, u.astype(x.dtype), precision=product_precision())
    g = project(upper / root.astype(upper.dtype)) * project(lower * root.astype(lower.dtype))
    return g, (rates[:, None] * lam[None, :]).astype(g.dtype)


def branch_value_and_slopes(g: Float[Array, "*K C P S"], exponents: Float[Array, "C S"],
                            weights: Float[Array, "*K P"], t: Float[Array, "*K"]):
    """`f(t) = sum_p w_p log n_p(t)`, `n_p(t) = sum_c,k g exp(e t)`, and its first two derivatives in `t`."""
    e = jnp.exp(exponents * t[..., None, None])  # [*K, C, S]: small, so g is read once per derivative order
    powers = jnp.stack([e, e * exponents, e * exponents**2], axis=-3)
    n, n1, n2 = jnp.moveaxis(jnp.einsum("...cpk,...jck->...jp", g, powers, precision=product_precision()), -2, 0)
    n = jnp.maximum(n, 1e-300)
    n1, n2 = n1 / n, n2 / n
    return jnp.sum(weights * jnp.log(n), -1), jnp.sum(weights * n1, -1), jnp.sum(weights * (n2 - n1 * n1), -1)


def branch_newton(g: Float[Array, "*K C P S"], exponents: Float[Array, "C S"], weights: Float[Array, "*K P"],
                  t0: Float[Array, "*K"]):
    """Maximise `f(t)` (`branch_value_and_slopes`) over `t` in [1e-6, 10] from `t0`: `(best t, f(best t))`.

    Safeguarded Newton: where `f''` is not negative the step doubles or halves
    `t` in the direction of `f'`; the best point seen is returned.
    """
    def step(_, state):
        t, best_t, best_f = state
        f, d1, d2 = branch_value_and_slopes(g, exponents, weights, t)
        better = f > best_f
        best_t, best_f = jnp.where(better, t, best_t), jnp.where(better, f, best_f)
        newton = t - d1 / jnp.where(d2 < 0, d2, -1.0)
        t = jnp.where(d2 < 0, newton, jnp.where(d1 > 0, 2 * t, 0.5 * t))
        return jnp.clip(t, MIN_LENGTH, MAX_LENGTH), best_t, best_f

    t0 = jnp.clip(t0, MIN_LENGTH, MAX_LENGTH)
    t, best_t, best_f = jax.lax.fori_loop(0, NEWTON_STEPS, step, (t0, t0, jnp.full(t0.shape, -jnp.inf, g.dtype)))
    f, _, _ = branch_value_and_slopes(g, exponents, weights, t)
    return jnp.where(f > best_f, t, best_t), jnp.maximum(f, best_f)


class NNIScores(eqx.Module):
    """Per internal node `v` of each tree: its edge's nodes, and gains and fitted lengths of both swaps."""

    nodes: Int[Array, "B K 5"]  # v, u, s, a, b
    gains: Float[Array, "B K 2"]  # log L after swap a<->s, b<->s (central branch fitted), minus log L now
    lengths: Float[Array, "B K 2"]
    valid: Bool[Array, "B K"]
    pattern_gains: Float[Array, "B K 2 P"] | None = None  # per pattern, with `per_pattern=True`


def nni_scores(parents: Int[Array, "B M"], lengths: Float[Array, "B M"], model, data, weights: Float[Array, "B P"],
               widths, dtype, per_pattern: bool = False) -> NNIScores:
    """Score both NNIs of every internal edge of every tree in one pass over the partials.

    `per_pattern` also returns `log L_c` after each swap minus `log L_c` now, per pattern (for SH-aLRT).
    """
    batch, m = parents.shape
    n = (m + 1) // 2
    partials = TreePartials(parents, lengths, model, data, widths, dtype)
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

    lengths_v = jnp.take_along_axis(lengths, v, axis=1)
    w = weights[:, None, None, :]

    def score(edges):
        """Fitted lengths, gains (and per-pattern gains) of one chunk of edges `[B, E]`."""
        u_, s_, a_, b_, t_now = (jnp.take_along_axis(x, edges, axis=1) for x in (u, s, a, b, lengths_v))
        q = partials.upper(u_)
        m_a, m_b, m_s = partials.message(a_), partials.message(b_), partials.message(s_)
        upper = jnp.stack([q * m_s, q * m_a, q * m_b], axis=2)
        lower = jnp.stack([m_a * m_b, m_s * m_b, m_a * m_s], axis=2)
        g, exponents = eigen_coefficients(model, upper, lower)
        t0 = jnp.broadcast_to(t_now[..., None], g.shape[:3])
        t, f = branch_newton(g[:, :, 1:], exponents, w.astype(g.dtype), t0[:, :, 1:])
        now, _, _ = branch_value_and_slopes(g[:, :, :1], exponents, w.astype(g.dtype), t0[:, :, :1])
        if not per_pattern:
            return t, f - now, None
        log_n = lambda g, t: jnp.log(jnp.maximum(jnp.einsum(
            "...cpk,...ck->...p", g, jnp.exp(exponents * t[..., None, None]), precision=product_precision()), 1e-300))
        return t, f - now, log_n(g[:, :, 1:], t) - log_n(g[:, :, :1], t0[:, :, :1])

    # Edges in chunks, so that the `[B, E, 3, C, P, S]` coefficients stay near `CHUNK_BYTES`.
    k = m - n
    edge_bytes = 3 * partials.post.shape[2] * partials.post.shape[3] * partials.post.shape[4] * 8 * batch
    chunk = max(1, min(k, CHUNK_BYTES // edge_bytes))
    chunks = -(-k // chunk)
    order = jnp.minimum(jnp.arange(chunks * chunk), k - 1).reshape(chunks, 1, chunk)
    t, gains, pattern_gains = jax.lax.map(lambda e: score(jnp.broadcast_to(e, (batch, chunk))), order)
    merge = lambda x: None if x is None else jnp.moveaxis(x, 0, 1).reshape((batch, chunks * chunk) + x.shape[3:])[:, :k]
    t, gains, pattern_gains = merge(t), merge(gains), merge(pattern_gains)
    return NNIScores(jnp.stack([v, u, s, a, b], axis=-1), jnp.where(valid[..., None], gains, -jnp.inf), t,
                     valid, pattern_gains)


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
    rows = jnp.arange(batch)[:, None]
    drop = lambda nodes: jnp.where(chosen, nodes, m)
    parents = parents.at[rows, drop(x)].set(u, mode="drop").at[rows, drop(s)].set(v, mode="drop")
    fitted = jnp.take_along_axis(scores.lengths, which[..., None], axis=2)[..., 0]
    lengths = lengths.at[rows, drop(v)].set(fitted, mode="drop")
    return parents, lengths
