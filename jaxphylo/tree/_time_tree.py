"""Rooted time trees: node heights, and the ratio transform that keeps them ordered.

Heights are measured backwards from the latest tip (height 0). Every internal
node `i` has an *anchor* `l_i`, the greatest tip height below it; its height
must exceed every child's. The ratio transform (Ji et al. 2021) writes the
root as `h_root = l_root + delta` and every other internal node as

    h_i = l_i + r_i (h_parent(i) - l_i),    r_i in (0, 1),

so any `delta > 0` and ratios in (0, 1) give an ordered tree. Its Jacobian is
triangular (a node depends on itself and its ancestors), so

    log |d heights / d (delta, r)| = sum_(i not root) log(h_parent(i) - l_i).

Writing `u_i = h_i - l_i`, the recursion is affine down the tree,
`u_i = r_i u_parent + r_i (l_parent - l_i)`, so heights come by pointer
jumping: every node composes its map with its ancestor's, doubling the reach
each round. `ceil(log2 depth)` fully vectorised rounds (5 for a 352-taxon
tree 30 levels deep) replace `depth` sequential ones; the work is
O(N log depth), and reverse mode stores one `[N]` array per round. A
level-by-level scan took 0.9 ms for value and gradient on an H100, 11% of a
whole leapfrog step on dengue352 (benchmarks/nuts.py).

Sampled tips (tip-date sampling): a tip with a date interval has a height
that is a parameter, so the anchors move with it. With `F` the fixed tips and
`S` the sampled ones, `l_i = max(max_(t in F below i) h_t, max_(t in S below i) h_t)`:
the first term is precomputed, the second a segment max over the precomputed
(sampled tip, ancestor) pairs. Tip heights `s` and `(delta, r)` map to
`(s, heights)` with a block-triangular Jacobian (tips do not depend on
`(delta, r)`), so the joint log-Jacobian is the tips' own plus the ratio
transform's `sum log(h_parent(i) - l_i(s))`.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from .._errors import InputError
from ._topology import Topology, Tree


@dataclass(frozen=True, eq=False)
class TimeTree:
    """A rooted topology and its tip heights, as index arrays for the ratio transform.

    Internal nodes are numbered as in the topology minus `num_tips` (the root is
    last). `ancestors[j]` is every internal node's ancestor `2^j` generations up
    (the root is its own), for the pointer-jumping rounds.

    Tips `free_tips` are sampled within `free_bounds` (`[low; high]` heights);
    `tip_heights` holds the fixed heights and, for sampled tips, a placeholder
    inside their bounds. `anchors` are those of `tip_heights`; `fixed_anchors`
    count fixed tips only (`-inf` above none), and `(pair_tips[p], pair_nodes[p])`
    lists every sampled tip with each internal node above it.
    """

    tip_heights: Float[np.ndarray, " tips"]
    anchors: Float[np.ndarray, " internal"]
    internal_parent: Int[np.ndarray, " internal"]
    ancestors: Int[np.ndarray, "rounds internal"]
    max_depth: int
    topology: Topology
    free_tips: Int[np.ndarray, " free"]
    free_bounds: Float[np.ndarray, "2 free"]
    fixed_anchors: Float[np.ndarray, " internal"]
    pair_tips: Int[np.ndarray, " pairs"]
    pair_nodes: Int[np.ndarray, " pairs"]

    # Compared by identity: it rides along as static data in NumPyro's constraints and transforms.

    @property
    def num_tips(self) -> int:
        return self.topology.num_tips

    @property
    def num_internal(self) -> int:
        return self.topology.num_nodes - self.topology.num_tips

    @property
    def contemporaneous(self) -> bool:
        return bool(np.all(self.tip_heights == 0)) and not self.sampled

    @property
    def sampled(self) -> bool:
        """Some tip heights are parameters."""
        return self.free_tips.size > 0


def time_tree(topology: Topology, tip_heights=None, tip_bounds=None) -> TimeTree:
    """The ratio-transform arrays of a rooted `topology`; tips at `tip_heights` (default: all 0).

    `tip_bounds` (`[2, tips]`: lowest and highest height of each tip) makes every
    tip whose bounds differ a sampled one; `tip_heights` then defaults to the
    bounds' midpoints.
    """
    n, m = topology.num_tips, topology.num_nodes
    if not topology.rooted:
        raise InputError("a time tree needs a rooted tree (the tree read has a trifurcating root)")
    bounds = None if tip_bounds is None else np.asarray(tip_bounds, float).reshape(2, n)
    if bounds is not None and np.any(bounds[0] > bounds[1]):
        raise InputError(f"taxon {topology.taxa[int(np.argmax(bounds[0] > bounds[1]))]!r}: "
                         "its lowest tip height is above its highest")
    tips = _start_tips(n, tip_heights, bounds)
    free = np.flatnonzero(bounds[1] > bounds[0]) if bounds is not None else np.zeros(0, np.int64)
    parent = topology.parent_array
    fixed = tips.copy()
    fixed[free] = -np.inf
    pair_tips, pair_nodes = _tip_ancestor_pairs(parent, free, n)
    k = m - n
    internal_parent = np.append(parent[n:-1] - n, k - 1).astype(np.int32)  # the root is its own parent
    max_depth, ancestors = _jump_table(parent, internal_parent, n)
    return TimeTree(tips, _anchors(parent, tips, m), internal_parent, ancestors, max_depth, topology,
                    free, np.zeros((2, 0)) if bounds is None else bounds[:, free], _anchors(parent, fixed, m),
                    pair_tips, pair_nodes)


def _start_tips(n: int, tip_heights, bounds) -> np.ndarray:
    if tip_heights is not None:
        return np.asarray(tip_heights, float).copy()
    if bounds is not None:
        return bounds.mean(0)
    return np.zeros(n)


def _anchors(parent: np.ndarray, tips: np.ndarray, m: int) -> np.ndarray:
    """The greatest tip height below every internal node (`-inf` where every tip below is `-inf`)."""
    n = len(tips)
    anchors = np.full(m, -np.inf)
    anchors[:n] = tips
    for node in range(m - 1):  # children precede parents
        anchors[parent[node]] = max(anchors[parent[node]], anchors[node])
    return anchors[n:]


def _tip_ancestor_pairs(parent: np.ndarray, free: np.ndarray, n: int):
    """Every sampled tip with every internal node above it (internal numbering)."""
    pairs = []
    for tip in free:
        node = tip
        while node != len(parent) - 1:
            node = parent[node]
            pairs.append((tip, node - n))
    table = np.array(pairs, np.int32).reshape(-1, 2)
    return table[:, 0], table[:, 1]


def _jump_table(parent: np.ndarray, internal_parent: np.ndarray, n: int):
    """The deepest internal node's depth, and ancestors `2^j` generations up for `ceil(log2 depth)` rounds."""
    m = len(parent)
    depth = np.zeros(m, np.int64)
    for node in range(m - 2, n - 1, -1):  # parents follow children: walk root-first
        depth[node] = depth[parent[node]] + 1
    max_depth = int(depth[n:].max(initial=0))
    ancestors, reach = [], internal_parent
    for _ in range(max(0, (max_depth - 1).bit_length())):  # ceil(log2 depth) rounds
        ancestors.append(reach)
        reach = reach[reach]
    return max_depth, np.array(ancestors, np.int32).reshape(-1, m - n)


def node_anchors(tree: TimeTree, tips: Float[Array, " tips"] | None = None, dtype=None) -> Float[Array, " internal"]:
    """`l_i`, the greatest tip height below each internal node, for tip heights `tips`.

    With no sampled tips (or `tips=None`) the precomputed `tree.anchors`;
    otherwise `max(fixed_anchors_i, max_(pairs p with node i) tips[pair_tips[p]])`.
    """
    if tips is None or not tree.sampled:
        return jnp.asarray(tree.anchors, dtype)
    tips = jnp.asarray(tips, dtype)
    sampled = jax.ops.segment_max(tips[tree.pair_tips], tree.pair_nodes, num_segments=tree.num_internal)
    return jnp.maximum(jnp.asarray(tree.fixed_anchors, tips.dtype), sampled)


def with_sampled_tips(tree: TimeTree, free: Float[Array, " free"]) -> Float[Array, " tips"]:
    """All tip heights: the fixed ones, and `free` at the sampled tips."""
    return jnp.asarray(tree.tip_heights, free.dtype).at[tree.free_tips].set(free)


def ratios_to_heights(
    tree: TimeTree, root_offset: Float[Array, ""], ratios: Float[Array, " internal_minus_root"],
    tips: Float[Array, " tips"] | None = None,
) -> Float[Array, " internal"]:
    """Internal node heights from `root_offset = h_root - l_root > 0` and the non-root ratios.

    `tips`: the current tip heights where some are sampled (default: `tree.tip_heights`).
    """
    anchors = node_anchors(tree, tips, ratios.dtype)
    # u_i = scale_i * u_(ancestor) + shift_i, starting from the parent; the root maps to itself
    scale = jnp.concatenate([ratios, jnp.ones(1, ratios.dtype)])
    shift = jnp.concatenate([ratios * (anchors[tree.internal_parent[:-1]] - anchors[:-1]), jnp.zeros(1, ratios.dtype)])
    scale, shift = _compose_to_root(scale, shift, tree.ancestors)
    return anchors + scale * root_offset + shift


def _compose_to_root(scale, shift, ancestors):
    """Pointer jumping of the affine maps `u -> scale u + shift` up the tree: after the rounds (`ancestors[r]`
    the node `2^r` generations up, the root its own), every node's map composed with all its ancestors'."""
    for ancestor in ancestors:
        shift = scale * shift[ancestor] + shift
        scale = scale * scale[ancestor]
    return scale, shift


def _doubling(jump, rounds: int):
    """`jump`, `jump[jump]`, ...: the ancestors `2^r` generations up, for `rounds` rounds, on the device."""
    for _ in range(rounds):
        yield jump
        jump = jump[jump]


def heights_to_ratios(tree: TimeTree, heights: Float[Array, " internal"], tips: Float[Array, " tips"] | None = None):
    """The inverse: `(root_offset, ratios)`."""
    anchors = node_anchors(tree, tips, heights.dtype)
    above = heights[tree.internal_parent[:-1]]
    ratios = (heights[:-1] - anchors[:-1]) / (above - anchors[:-1])
    return heights[-1] - anchors[-1], ratios


def ratio_log_jacobian(
    tree: TimeTree, heights: Float[Array, " internal"], tips: Float[Array, " tips"] | None = None
) -> Float[Array, ""]:
    """`log |d heights / d (root_offset, ratios)| = sum log(h_parent - l_i)` over non-root internal nodes."""
    anchors = node_anchors(tree, tips, heights.dtype)
    return jnp.sum(jnp.log(heights[tree.internal_parent[:-1]] - anchors[:-1]))


def all_heights(
    tree: TimeTree, heights: Float[Array, " internal"], tips: Float[Array, " tips"] | None = None
) -> Float[Array, " nodes"]:
    """Tip heights (`tips`, default the tree's) then internal heights: every node's height."""
    tips = tree.tip_heights if tips is None else tips
    return jnp.concatenate([jnp.asarray(tips, heights.dtype), heights])


def branch_durations(
    tree: TimeTree, heights: Float[Array, " internal"], tips: Float[Array, " tips"] | None = None
) -> Float[Array, " nodes"]:
    """Time along the branch above every node (the root's entry is 0)."""
    h = all_heights(tree, heights, tips)
    parent = tree.topology.parent_array
    return jnp.concatenate([h[parent[:-1]] - h[:-1], jnp.zeros(1, h.dtype)])


def heights_from_tree(tree: Tree, time: TimeTree, tolerance: float = 1e-4) -> np.ndarray:
    """Internal node heights of a tree read from a file, checked against the tips' heights.

    Contemporaneous tips need an ultrametric tree; dated tips a tree whose tip
    depths match their dates (to `tolerance` times the root height). With
    sampled tips, see `start_heights`.
    """
    return start_heights(tree, time, tolerance)[1]


def start_heights(tree: Tree, time: TimeTree, tolerance: float = 1e-4) -> tuple[np.ndarray, np.ndarray]:
    """Tip and internal heights to start from: the tree's, shifted to put the fixed tips at their heights.

    Fixed tips must sit where the tree puts them (checked as `heights_from_tree`
    says). Sampled tips take the tree's height clipped to the inside of their
    bounds (with no fixed tip, the shift matches the mean tree height of the tips
    to the mean of the bounds' midpoints); internal nodes are then raised where
    needed to stay above their children.
    """
    heights = _tree_node_heights(tree)
    n = time.num_tips
    fixed = np.ones(n, bool)
    fixed[time.free_tips] = False
    offset = _fixed_tip_offset(tree, time, heights, fixed, tolerance)
    if not time.sampled:
        return time.tip_heights, heights[n:] - offset
    heights = heights - offset
    low, high = time.free_bounds
    margin = 1e-3 * (high - low)
    heights[:n][fixed] = time.tip_heights[fixed]
    heights[time.free_tips] = np.clip(heights[time.free_tips], low + margin, high - margin)
    return heights[:n], _raise_above_children(heights, time.topology.parent_array)[n:]


def _tree_node_heights(tree: Tree) -> np.ndarray:
    """Every node's height above the tree's most distant tip from the root."""
    topology = tree.topology
    lengths = np.asarray(tree.branch_lengths, float)
    depth = np.zeros(topology.num_nodes)  # distance from the root
    for node in range(topology.num_nodes - 2, -1, -1):
        depth[node] = depth[topology.parent[node]] + lengths[node]
    return depth[: topology.num_tips].max() - depth


def _fixed_tip_offset(tree, time, heights, fixed, tolerance) -> float:
    """The shift from the tree's heights to the tips' (checked to agree over fixed tips)."""
    n = time.num_tips
    if not fixed.any():
        return float(np.mean(heights[:n] - time.free_bounds.mean(0)))
    offset = heights[:n][fixed] - time.tip_heights[fixed]
    taxa = np.asarray(tree.topology.taxa)[fixed]
    worst = int(np.argmax(np.abs(offset - offset.min())))
    if np.abs(offset - offset.min()).max() > tolerance * max(heights[-1], 1e-300):
        need = "ultrametric" if time.contemporaneous else "consistent with the tip dates"
        raise InputError(f"the tree is not {need}: taxon {taxa[worst]!r} is "
                         f"{offset[worst] - offset.min():.6g} away from where the others put it")
    return offset.min()


def _raise_above_children(heights: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Heights with every parent at least a small step above each child."""
    heights = heights.copy()
    step = 1e-6 * max(float(np.ptp(heights)), 1.0)
    for node in range(len(parent) - 1):  # children precede parents, so each is final when used
        heights[parent[node]] = max(heights[parent[node]], heights[node] + step)
    return heights


# ---- The same transform with the topology as data (parents `[M]` on the device, moved by MCMC): every node
# ---- indexed as in the parent array, ratios in logit coordinates `z`, the root's offset as its log.


def jumps(parents: Int[Array, "M"]) -> Int[Array, "M"]:  # noqa: F821
    """The parent of every node, the root (and detached nodes, parent -1) pointing at themselves."""
    return jnp.where(parents >= 0, parents, jnp.arange(parents.shape[0]))


def jump_rounds(m: int) -> int:
    """Pointer-jumping rounds that reach the root from any of `m` nodes."""
    return max(1, (m - 1).bit_length())


def ancestors_of(parents: Int[Array, "M"], node) -> Bool[Array, "M"]:  # noqa: F821
    """Each node is an ancestor-or-self of `node`: the set `{parent^k(node)}` grows by `parent^(2^r)` of itself."""
    flag = jnp.arange(parents.shape[0]) == node
    for jump in _doubling(jumps(parents), jump_rounds(parents.shape[0])):
        flag = flag.at[jump].max(flag)
    return flag


def anchors_on(parents: Int[Array, "M"], tip_heights: Float[Array, " tips"]) -> Float[Array, "M"]:  # noqa: F821
    """`l_v`: the oldest tip height below every node (a tip's own), from each tip's ancestors."""
    n = tip_heights.shape[0]
    above = jax.vmap(ancestors_of, in_axes=(None, 0))(parents, jnp.arange(n))  # [tips, M]
    return jnp.max(jnp.where(above, tip_heights[:, None], -jnp.inf), axis=0)


def ratio_heights_on(parents: Int[Array, "M"], anchors: Float[Array, "M"], z: Float[Array, "M"],  # noqa: F821
                     num_tips: int) -> Float[Array, "M"]:  # noqa: F821
    """Node heights from ratio coordinates `z` (tips' entries unused): `h = l + u`, `u_root = exp(z_root)`,
    `u_i = r_i (u_parent + l_parent - l_i)` with `r_i = sigmoid(z_i)`, composed up to the root."""
    m = parents.shape[0]
    node = jnp.arange(m)
    is_root, is_tip = parents < 0, node < num_tips
    jump = jnp.where(is_root, node, parents)
    r = jax.nn.sigmoid(z)
    scale = jnp.where(is_tip, 0.0, jnp.where(is_root, 1.0, r))
    shift = jnp.where(is_tip | is_root, 0.0, r * (anchors[jump] - anchors))
    scale, shift = _compose_to_root(scale, shift, _doubling(jump, jump_rounds(m)))
    return anchors + scale * jnp.exp(z[jnp.argmin(parents)]) + shift


def ratio_coordinates_on(parents: Int[Array, "M"], anchors: Float[Array, "M"], heights: Float[Array, "M"],  # noqa: F821
                         num_tips: int) -> Float[Array, "M"]:  # noqa: F821
    """The inverse of `ratio_heights_on` (tips' entries 0)."""
    node = jnp.arange(parents.shape[0])
    root = jnp.argmin(parents)
    above = heights[jnp.maximum(parents, 0)]
    z = jax.scipy.special.logit((heights - anchors) / (above - anchors))
    z = jnp.where(node < num_tips, 0.0, z)
    return z.at[root].set(jnp.log(heights[root] - anchors[root]))


def ratio_log_jacobian_on(parents, anchors, heights, z, num_tips: int) -> Float[Array, ""]:
    """`log |dh/dz| = z_root + sum_(i not root) [log(h_parent(i) - l_i) + log r_i + log(1 - r_i)]`."""
    node = jnp.arange(parents.shape[0])
    inner = (node >= num_tips) & (parents >= 0)
    # the root and tips are masked before the log: `log(0)` there (tip 0 the oldest, as with contemporaneous
    # tips) would make the gradient NaN even where the value is dropped
    span = jnp.where(inner, heights[jnp.maximum(parents, 0)] - anchors, 1.0)
    terms = jnp.log(span) + jax.nn.log_sigmoid(z) + jax.nn.log_sigmoid(-z)
    return jnp.sum(jnp.where(inner, terms, 0.0)) + z[jnp.argmin(parents)]
