"""Subtree pruning and regrafting: every regraft within a radius scored at once from the current partials.

In the unrooted tree (the kernel root merged away, `_rooting`), pruning the
side of `v` off the edge `(u, v)` removes `u` and joins its other neighbours
`s1, s2` by one edge of length `t_us1 + t_us2`; regrafting inserts `u` into an
edge `(x, y)` of the remaining tree at distance 1..`radius` (in edges; IQ-TREE's
default is 6) from that joined edge, `x` the nearer end.

Write `D[a|b]` for the partials at `a` of the part of the tree on `a`'s side
of the edge `(a, b)`, with no root frequencies in them. Every side of every
edge that does not hold `u` is the same in the pruned tree as now, so its
`D` is read from the current tree's passes: `p_a` when `b` is `a`'s parent,
and `s_b / (w pi)` when `a` is `b`'s parent (`s_b = q_a o P_sib p_sib`,
`_preorder`). Only the sides that hold the pruning point change; along every
path of regraft edges, the pruned tree's `X_x = D[x|y]` follows from the one
before it, RAxML's incremental update:

    X at the first x (= s1):  (P(t_us1 + t_us2) D[s2|u]) o (P(t_xz) D[z|x])
    X one edge further:       (P(t_x'x) X_x')           o (P(t_xz) D[z|x])

with `z` the third neighbour of `x`. A candidate's likelihood is then, per
pattern, `sum_r w_r sum_k pi_k [P(t_x) X](k) [P(t_y) D[y|x]](k) [P(t_v) D[v|u]](k)`.
Every slot is screened with `t_x = t_y = t_xy / 2` and `t_v = t_uv` (RAxML's
lazy SPR); the best slot of each pruning then gets its three new branches
fitted by safeguarded Newton steps (`_nni.branch_newton`), `t_v`, then `t_y`,
then `t_x`; every other branch keeps its length. Stored partials are rescaled, so each `D` comes with the log of what it
was divided by: a post-order vector's is its subtree's scale factors
(`TreePartials.scale`); a pre-order one's follows from `log L_c` at its branch,
`log L_c = log n_b + sigma(D[a|b]) + sigma(D[b|a])`. Candidates' log
likelihoods are therefore exact for the tree with those lengths, not an
approximation (a test checks them against whole-tree evaluations).

The device scores every pruning of a tree: its real regraft slots (at most
`2N - 6`, and never more than the `2 (2^(radius+1) - 2)` of the binary paths
from `s1` and `s2`) packed and computed one after the other (`regrafts`), in
chunks of prunings, with one compiled program for any topology of N taxa and
radius. The host then builds the best few as trees, to be re-fitted whole.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from ..runtime import product_precision
from ..tree import kernel_children, rooted_on_first_tip, unrooted
from ._nni import (CHUNK_BYTES, EigenSystem, TreePartials, _parts_last, branch_newton, eigen_coefficients,
                   part_branch_newton, part_sources)
from ..models import MAX_LENGTH, MIN_LENGTH

class UnrootedTree(eqx.Module):
    """A kernel tree rooted on tip 0, seen unrooted: three neighbours per internal node, the root merged away."""

    parents: Int[Array, " M"]
    neighbours: Int[Array, "M 3"]  # parent (the root's other child for the root's children), then children; M: none
    edge: Float[Array, "M *K"]  # length of the edge to `neighbours[:, 0]`
    root: Int[Array, ""]

    @staticmethod
    def of(parents: Int[Array, " M"], lengths: Float[Array, "M *K"]) -> "UnrootedTree":
        m = parents.shape[0]
        root = jnp.argmin(parents)
        kids = kernel_children(parents)
        below_root = parents == root
        other = jnp.where(kids[root, 0] == jnp.arange(m), kids[root, 1], kids[root, 0])
        up = jnp.where(below_root, other, jnp.where(parents < 0, m, parents))
        # The root's two branches are one edge; its children both see the other across it.
        joined = jnp.sum(jnp.where(below_root.reshape((m,) + (1,) * (lengths.ndim - 1)), lengths, 0.0), axis=0)
        edge = jnp.where(below_root.reshape((m,) + (1,) * (lengths.ndim - 1)), joined, lengths)
        return UnrootedTree(parents, jnp.concatenate([up[:, None], kids], axis=1), edge, root)

    def length(self, a, b) -> Float[Array, "..."]:
        """Length of the edge between neighbours `a` and `b`."""
        return jnp.where(self.neighbours[a, 0] == b, self.edge[a], self.edge[b])

    def forward(self, x, previous) -> Int[Array, "... 2"]:
        """The two neighbours of internal node `x` other than `previous`."""
        around = self.neighbours[x]
        keep = around != previous[..., None]
        order = jnp.argsort(~keep, axis=-1, stable=True)
        return jnp.take_along_axis(around, order[..., :2], axis=-1)


class DirectedPartials(eqx.Module):
    """`D[a|b]` for both sides of every edge of one tree and one part, the log factors they lack, and the
    messages they send across their edge: rows `k` hold `D[k|parent(k)] = p_k`, rows `M + k` hold
    `D[parent(k)|k] = s_k / (w pi)`."""

    vectors: Float[Array, "2M C P S"]
    scales: Float[Array, "2M P"]
    messages: Float[Array, "2M C P S"]  # P(t) D across the whole edge
    halves: Float[Array, "2M C P S"]  # P(t / 2) D: to the middle of the edge

    @staticmethod
    def of(partials: TreePartials, tree: UnrootedTree, eigen: EigenSystem) -> "DirectedPartials":
        """From one tree's passes (`partials` with a batch of one)."""
        m = tree.parents.shape[0]
        nodes = jnp.arange(m)
        parent = jnp.where(tree.parents < 0, tree.root, tree.parents)  # the root's own entries are never read
        kids = tree.neighbours[parent, 1:]
        sibling = jnp.where(kids[:, 0] == nodes, kids[:, 1], kids[:, 0])
        one = lambda x: x[None]  # noqa: E731
        down, down_scale = partials.partial(one(nodes))[0], partials.scale(one(nodes))[0]
        s = partials.upper(one(parent))[0] * partials.message(one(sibling))[0]
        n = jnp.sum(s * partials.message(one(nodes))[0], axis=(1, 3))
        root_weights = partials.category_weights[0][:, None, None] * partials.frequencies[0][None, None, :]
        up = s / jnp.where(root_weights > 0, root_weights, 1.0)
        up_scale = partials.log_likelihoods[0] - jnp.log(jnp.maximum(n, 1e-300)) - down_scale
        vectors = jnp.concatenate([down, up])
        projected, edge = to_eigen(eigen, vectors), jnp.concatenate([tree.edge, tree.edge])
        return DirectedPartials(vectors, jnp.concatenate([down_scale, up_scale]),
                                from_eigen(eigen, projected, edge), from_eigen(eigen, projected, edge / 2))

    @staticmethod
    def index(tree: UnrootedTree, a, b):
        """Row of `D[a|b]` for neighbours `a`, `b` (any matching shapes)."""
        is_down = (tree.parents[a] == b) | ((tree.parents[a] == tree.root) & (tree.parents[b] == tree.root))
        return jnp.where(is_down, a, tree.parents.shape[0] + b)


def to_eigen(eigen: EigenSystem, x: Float[Array, "*K C P S"]) -> Float[Array, "*K C P S"]:
    """`U^T (D^1/2 x)`: `x` in the eigenbasis of the symmetrised rate matrix."""
    vectors, root = eigen.vectors.astype(x.dtype), eigen.root.astype(x.dtype)
    return jnp.einsum("...s,sk->...k", x * root, vectors, precision=product_precision())


def from_eigen(eigen: EigenSystem, y: Float[Array, "*K C P S"], t: Float[Array, "*K"]) -> Float[Array, "*K C P S"]:
    """`P(t) x = D^-1/2 U (exp(lam rho t) o y)` for `y = to_eigen(x)`."""
    vectors, root = eigen.vectors.astype(y.dtype), eigen.root.astype(y.dtype)
    y = y * jnp.exp(eigen.rates[:, None, None] * eigen.values[None, None, :] * t[..., None, None, None]).astype(y.dtype)
    return jnp.einsum("...k,sk->...s", y, vectors, precision=product_precision()) / root


def propagate(eigen: EigenSystem, x: Float[Array, "*K C P S"], t: Float[Array, "*K"]) -> Float[Array, "*K C P S"]:
    """`P(t) x` through the eigensystem."""
    return from_eigen(eigen, to_eigen(eigen, x), t)


class Regrafts(eqx.Module):
    """One pruning's real regraft slots, packed (`slot_capacity`): the pruned tree's vectors at both ends of each."""

    x: Int[Array, " R"]
    y: Int[Array, " R"]
    valid: Bool[Array, " R"]
    toward: Float[Array, "R C P S"]  # X = D'[x|y] in the pruned tree
    toward_half: Float[Array, "R C P S"]  # P(t_xy / 2) X
    away: Int[Array, " R"]  # the `DirectedPartials` row of D[y|x]
    scale: Float[Array, "R P"]  # log factors of X and D[y|x] together
    length: Float[Array, " R"]  # t_xy


def padded_slots(radius: int) -> int:
    """Regraft slots of a pruning on the binary paths from both ends of the joined edge: `2 (2^(radius+1) - 2)`."""
    return 2 * (2 ** (radius + 1) - 2)


def slot_capacity(num_tips: int, radius: int) -> int:
    """Slots a pruning can really have: the pruned tree has at most `N - 1` taxa, so `2N - 5` edges, one of
    them the joined edge; fewer than the padded paths once `radius` is past 4 or so (a slot past a tip is
    never real)."""
    return max(1, min(padded_slots(radius), 2 * num_tips - 6))


def regrafts(tree: UnrootedTree, sides: DirectedPartials, eigen: EigenSystem, u, v, s1, s2, valid, radius: int
             ) -> Regrafts:
    """Every regraft edge of the pruning of `v`'s side off `(u, v)`, packed.

    The slots are first enumerated as indices only, level by level along the
    binary paths from the joined edge (slot `i` of a level continues slot
    `i // 2` of the one before); the real ones (not past a tip) are packed, in
    that order, into `slot_capacity` places, and their vectors computed one
    slot after the other from their predecessor's, so a pruning costs what it
    has, not the `padded_slots` of a full binary path. Each level keeps at most
    `slot_capacity` slots, its real ones first, so the enumeration grows as
    `radius x capacity` (radius 30 on 129 taxa: 2^31 indices before).
    """
    n = (tree.parents.shape[0] + 1) // 2
    capacity = slot_capacity(n, radius)
    x, previous = jnp.stack([s1, s2]), jnp.stack([u, u])
    alive = valid & (x >= n)
    found, start, before_start = [], 0, 0
    for level in range(radius):
        ahead = tree.forward(x, previous)  # [W, 2]: y for the two slots, and each one's z is the other
        y, z = ahead.reshape(-1), ahead[:, ::-1].reshape(-1)
        x2, alive2 = jnp.repeat(x, 2), jnp.repeat(alive, 2)
        before = jnp.arange(y.shape[0]) // 2 + before_start  # the slot each continues, in the whole list
        side = jnp.arange(y.shape[0]) // 2 if level == 0 else jnp.zeros(y.shape[0], jnp.int32)  # 0: from s1
        # A level never has more real slots than the whole capacity: keep that many, the real ones first
        # (in order), so the lists grow as radius x capacity, not as the 2^radius binary paths.
        keep = jnp.argsort(~alive2, stable=True)[:min(y.shape[0], capacity)]
        x2, y, z, alive2, before, side = (a[keep] for a in (x2, y, z, alive2, before, side))
        found.append((x2, y, z, alive2, before, jnp.full(y.shape[0], level), side))
        before_start, start = start, start + y.shape[0]
        x, previous, alive = y, x2, alive2 & (y >= n)
    x, y, z, alive, before, level, side = (jnp.concatenate(a) for a in zip(*found))
    order = jnp.argsort(~alive, stable=True)[:capacity]
    packed = jnp.zeros(x.shape[0], jnp.int32).at[order].set(jnp.arange(capacity, dtype=jnp.int32))
    x, y, z, alive, level, side = x[order], y[order], z[order], alive[order], level[order], side[order]
    before = packed[before[order]]
    joined = sides.index(tree, jnp.stack([s2, s1]), jnp.stack([u, u]))
    incoming = propagate(eigen, sides.vectors[joined], jnp.broadcast_to(tree.length(u, s1) + tree.length(u, s2), (2,)))
    sibling, away, length = sides.index(tree, z, x), sides.index(tree, y, x), tree.length(x, y)

    def slot(k, carry):
        toward, projected, scale = carry
        first, j = level[k] == 0, before[k]
        into = jnp.where(first, incoming[jnp.minimum(side[k], 1)], from_eigen(eigen, projected[j], length[j]))
        into_scale = jnp.where(first, sides.scales[joined][jnp.minimum(side[k], 1)], scale[j])
        vector = into * sides.messages[sibling[k]]
        top = jnp.max(vector, axis=(-3, -1))
        top = jnp.where(top > 0, top, 1.0)
        vector = vector / top[None, :, None]
        return toward.at[k].set(vector), projected.at[k].set(to_eigen(eigen, vector)), \
            scale.at[k].set(into_scale + sides.scales[sibling[k]] + jnp.log(top))

    shape = (capacity,) + sides.vectors.shape[1:]
    empty = jnp.zeros(shape, sides.vectors.dtype)
    toward, projected, scale = jax.lax.fori_loop(0, capacity, slot, (empty, empty, jnp.zeros(
        (capacity,) + sides.scales.shape[1:], sides.scales.dtype)))
    return Regrafts(x, y, alive, toward, from_eigen(eigen, projected, length / 2), away, scale + sides.scales[away],
                    length)


class SPRScores(eqx.Module):
    """Per pruning `(u, v)` of a tree: its best regraft `(x, y)`, the three fitted new branches and the gain."""

    nodes: Int[Array, "J 4"]  # u, v, x, y
    lengths: Float[Array, "J 3 *K"]  # t_x, t_y, t_v
    gains: Float[Array, " J"]  # log L of the regrafted tree minus log L now (-inf: no regraft)


def prunings(tree: UnrootedTree):
    """`(u, v, s1, s2, valid)`, `[3 (N - 1)]` each: every internal node `u` with each of its neighbours `v`
    (the root's entries are not valid), and `u`'s two other neighbours."""
    m = tree.parents.shape[0]
    n = (m + 1) // 2
    u = jnp.repeat(jnp.arange(n, m, dtype=tree.parents.dtype), 3)
    v = tree.neighbours[u, jnp.tile(jnp.arange(3), m - n)]
    around = tree.neighbours[u]
    others = jnp.argsort(around == v[:, None], axis=1, stable=True)[:, :2]
    s1, s2 = (jnp.take_along_axis(around, others[:, k:k + 1], axis=1)[:, 0] for k in (0, 1))
    return u, v, s1, s2, u != tree.root


def regraft_edges(parents: Int[Array, " M"], lengths: Float[Array, " M"], radius: int) -> dict:
    """The regraft slots `spr_scores` scores, on the host: `{(u, v): {frozenset((x, y)), ...}}` per pruning."""
    tree = UnrootedTree.of(parents, lengths)
    m = parents.shape[0]
    vectors, scales = jnp.ones((2 * m, 1, 1, 1)), jnp.zeros((2 * m, 1))
    eigen = EigenSystem(jnp.zeros(1), jnp.eye(1), jnp.ones(1), jnp.ones(1))
    u, v, s1, s2, valid = prunings(tree)
    sides = DirectedPartials(vectors, scales, vectors, vectors)
    found = jax.jit(jax.vmap(lambda *p: regrafts(tree, sides, eigen, *p, radius)))(u, v, s1, s2, valid)
    edges = {}
    for j in np.flatnonzero(np.asarray(valid)):
        alive = np.asarray(found.valid[j])
        edges[int(u[j]), int(v[j])] = {frozenset((int(x), int(y))) for x, y in
                                       zip(np.asarray(found.x[j])[alive], np.asarray(found.y[j])[alive])}
    return edges


def spr_scores(parents: Int[Array, " M"], lengths: Float[Array, "M *K"], model, data,
               weights: Float[Array, " P"], widths, dtype, radius: int) -> SPRScores:
    """Score every regraft within `radius` of every pruning of one tree (one batched device computation)."""
    m = parents.shape[0]
    n = (m + 1) // 2
    tree = UnrootedTree.of(parents, lengths)
    unlinked = lengths.ndim == 2
    sources = part_sources(parents[None], lengths[None], model, data, weights[None], widths, dtype)
    # Per part, its own lengths: unlinked ones are the part's column; linked ones are the tree's (the part's
    # rate is in its eigensystem).
    part_trees = [jax.vmap(lambda k: eqx.tree_at(lambda t: t.edge, tree, tree.edge[:, k]))(jnp.asarray(s.parts))
                  if unlinked else jax.tree.map(lambda a: jnp.broadcast_to(a, (len(s.parts),) + a.shape), tree)
                  for s in sources]
    sides = [jax.vmap(DirectedPartials.of)(s.partials, t, s.eigen) for s, t in zip(sources, part_trees)]
    now = sum(jnp.sum(s.weights[:, 0] * s.partials.log_likelihoods[:, 0]) for s in sources)
    u, v, s1, s2, valid = prunings(tree)

    def score(chunk):
        """Best regraft of each pruning of a chunk `[J]`."""
        u_, v_, s1_, s2_, valid_ = (a[chunk] for a in (u, v, s1, s2, valid))
        screen, found, groups = 0.0, None, []
        for source, t, d in zip(sources, part_trees, sides):
            one = lambda t, d, e, *p: regrafts(t, d, e, *p, radius)  # noqa: E731
            per_pruning = jax.vmap(one, in_axes=(None, None, None, 0, 0, 0, 0, 0))
            r = jax.vmap(per_pruning, in_axes=(0, 0, 0, None, None, None, None, None))(
                t, d, source.eigen, u_, v_, s1_, s2_, valid_)  # [K_g, J, R]
            pruned = jax.vmap(lambda t: DirectedPartials.index(t, v_, u_))(t)  # [K_g, J]
            pruned_vector, pruned_scale, pruned_message = jax.vmap(
                lambda d, rows: (d.vectors[rows], d.scales[rows], d.messages[rows]))(d, pruned)
            part_weights = source.weights[:, 0][:, None, None, :].astype(dtype)  # [K_g, 1, 1, P]
            root_weights = (source.partials.category_weights[:, 0, :, None, None] *
                            source.partials.frequencies[:, 0, None, None, :])[:, None, None]
            fixed = jnp.sum(part_weights * (r.scale + pruned_scale[:, :, None]), -1)  # [K_g, J, R]
            # RAxML's lazy screen: every slot with t_x = t_y = t_xy / 2 and t_v = t_uv ...
            away_half = jax.vmap(lambda d, rows: d.halves[rows])(d, r.away)
            n_c = jnp.sum(root_weights * r.toward_half * away_half * pruned_message[:, :, None], axis=(-3, -1))
            screen = screen + jnp.sum(fixed + jnp.sum(part_weights * jnp.log(jnp.maximum(n_c, 1e-300)), -1), 0)
            groups.append((source, d, r, pruned_vector, t, part_weights, root_weights, fixed))
            found = r
        best = jnp.argmax(jnp.where(found.valid[0], screen, -jnp.inf), axis=1)
        # ... then each pruning's best slot gets its three new branches fitted.
        chosen = [NewBranches(_slot(r.toward, best), jax.vmap(lambda d, rows: d.vectors[rows])(d, _slot(r.away, best)),
                              pruned_vector[:, :, None], _slot(r.length, best),
                              jax.vmap(lambda t: t.length(u_, v_))(t)[:, :, None], source.eigen, root_weights,
                              part_weights, _slot(fixed, best))
                  for source, d, r, pruned_vector, t, part_weights, root_weights, fixed in groups]
        t_x, t_y, t_v = _fit_new_branches(chosen, unlinked)
        f = sum(jnp.sum(c.fixed, 0) for c in chosen) + _log_likelihood(chosen, t_x, t_y, t_v, unlinked)
        gains = jnp.where(jnp.any(found.valid[0], axis=1), f[:, 0] - now, -jnp.inf)
        fitted = [_with_parts(t, sources, unlinked)[:, 0] for t in (t_x, t_y, t_v)]
        pick = lambda a: _slot(a[None], best)[0, :, 0]  # noqa: E731
        return jnp.stack([u_, v_, pick(found.x[0]), pick(found.y[0])], axis=1), jnp.stack(fitted, axis=1), gains

    # Prunings in chunks, so that the `[K_g, J, R, C, P, S]` vectors of a chunk stay near `CHUNK_BYTES`.
    count = 3 * (m - n)
    per_slot = sum(int(np.prod(s.partials.post.shape[3:])) * len(s.parts) for s in sources)
    slots_per_pruning = slot_capacity(n, radius)
    chunk = max(1, min(count, CHUNK_BYTES // (6 * 8 * per_slot * slots_per_pruning)))
    chunks = -(-count // chunk)
    order = jnp.minimum(jnp.arange(chunks * chunk), count - 1).reshape(chunks, chunk)
    nodes, fitted, gains = jax.lax.map(score, order)
    merge = lambda a: a.reshape((chunks * chunk,) + a.shape[2:])[:count]  # noqa: E731
    return SPRScores(merge(nodes), merge(fitted), merge(gains))


class NewBranches(eqx.Module):
    """The vectors around one chosen regraft of each pruning, for one group: parts first, `[K_g, J, 1, ...]`."""

    toward: Float[Array, "K J 1 C P S"]  # X at x
    away: Float[Array, "K J 1 C P S"]  # D[y|x] at y
    pruned: Float[Array, "K J 1 C P S"]  # D[v|u] at v
    length: Float[Array, "K J 1"]  # t_xy
    start_v: Float[Array, "K J 1"]  # t_uv
    eigen: EigenSystem
    root_weights: Float[Array, "K 1 1 C 1 S"]  # w pi
    weights: Float[Array, "K 1 1 P"]
    fixed: Float[Array, "K J 1"]  # sum_p w_p (log factors of the three vectors)


def _part_lengths(t, index: int, unlinked: bool):
    """Group `index`'s parts' lengths `[K_g, J, 1]`: their own (unlinked, `t` a list), or the shared `[J, 1]`."""
    return t[index] if unlinked else t[None]


def _with_parts(t, sources, unlinked: bool):
    """Fitted lengths `[J, 1]`, or unlinked ones with the model's parts last `[J, 1, K]`."""
    return _parts_last(t, sources) if unlinked else t


def _new_branch(c: NewBranches, index, t_x, t_y, t_v, which, unlinked):
    """Eigen coefficients of branch `which` of one group's chosen regrafts, the other two at their lengths."""
    t = {name: jnp.broadcast_to(_part_lengths(x, index, unlinked), c.length.shape)
         for name, x in (("x", t_x), ("y", t_y), ("v", t_v))}
    vectors = {"x": c.toward, "y": c.away, "v": c.pruned}
    upper = c.root_weights
    for name in ("x", "y", "v"):
        if name != which:
            upper = upper * jax.vmap(propagate)(c.eigen, vectors[name], t[name])
    return jax.vmap(eigen_coefficients)(c.eigen, upper, vectors[which])


def _slot(a: Array, best: Int[Array, " J"]) -> Array:
    """Slot `best[j]` of every pruning `j` of `a [K_g, J, R, ...]`, keeping the slot axis: `[K_g, J, 1, ...]`."""
    return jnp.take_along_axis(a, best.reshape((1, -1, 1) + (1,) * (a.ndim - 3)), axis=2)


def _fit_new_branches(chosen: list[NewBranches], unlinked: bool):
    """`t_v`, then `t_y`, then `t_x` by Newton's method, from `t_x = t_y = t_xy / 2` and `t_v = t_uv`."""
    if unlinked:
        t_x, t_v = [c.length / 2 for c in chosen], [c.start_v for c in chosen]
    else:
        t_x, t_v = chosen[0].length[0] / 2, chosen[0].start_v[0]
    t_y = t_x
    for which in ("v", "y", "x"):
        terms = [_new_branch(c, i, t_x, t_y, t_v, which, unlinked) + (c.weights,) for i, c in enumerate(chosen)]
        now = {"x": t_x, "y": t_y, "v": t_v}[which]
        fitted, _ = (part_branch_newton if unlinked else branch_newton)(terms, now)
        t_x, t_y, t_v = (fitted if which == name else old for name, old in (("x", t_x), ("y", t_y), ("v", t_v)))
    return t_x, t_y, t_v


def _log_likelihood(chosen: list[NewBranches], t_x, t_y, t_v, unlinked: bool) -> Float[Array, "J 1"]:
    """`sum_p w_p log n_p` of the chosen regrafts at the fitted lengths, summed over parts (no scale factors)."""
    total = 0.0
    for i, c in enumerate(chosen):
        g, e = _new_branch(c, i, t_x, t_y, t_v, "x", unlinked)
        t = jnp.broadcast_to(_part_lengths(t_x, i, unlinked), c.length.shape)
        n = jnp.einsum("...cpk,...ck->...p", g, jnp.exp(e[:, None, None] * t[..., None, None]),
                       precision=product_precision())
        total = total + jnp.sum(c.weights * jnp.log(jnp.maximum(n, 1e-300)), axis=(0, -1))
    return total


def regrafted_tree(parent: np.ndarray, lengths: np.ndarray, nodes, new_lengths) -> tuple[np.ndarray, np.ndarray]:
    """The kernel tree (rooted on tip 0) of one scored SPR: `nodes = (u, v, x, y)`, `new_lengths = (t_x, t_y, t_v)`."""
    neighbours, root = unrooted(parent, lengths)
    u, v, x, y = (int(k) for k in nodes)
    t_x, t_y, t_v = (np.clip(np.asarray(t, float), MIN_LENGTH, MAX_LENGTH) for t in new_lengths)
    s1, s2 = (k for k in neighbours[u] if k != v)
    joined = neighbours[u][s1] + neighbours[u][s2]
    for k in (v, s1, s2):
        del neighbours[k][u]
    neighbours[s1][s2] = neighbours[s2][s1] = joined
    del neighbours[x][y], neighbours[y][x]
    neighbours[u] = {x: t_x, y: t_y, v: t_v}
    neighbours[x][u], neighbours[y][u], neighbours[v][u] = t_x, t_y, t_v
    return rooted_on_first_tip(neighbours, root)
