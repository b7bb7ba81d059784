"""The traversal schedule: topology turned into padded index arrays, outside jit.

Kernels see a *binary* rooted tree ("kernel nodes"): tips `0..N-1`, internal
nodes `N..2N-2`, root `2N-2`, and a padding sentinel `2N-1`. Polytomies (the
trifurcating root of an unrooted tree included) are resolved with zero-length
branches, which leave the likelihood unchanged.

Internal nodes are processed level by level (a node's level is one more than
its highest child's), in *phases* of fixed widths `W_0 > W_1 > ... > 1`
(powers of two). A level goes to the narrowest phase it fits in, split into
several steps if it is wider. Phase widths depend only on N and `max_width`,
and the number of steps per phase is data, so every topology of N taxa runs
the same compiled code. Each step pads at most to twice its level's width.
`max_width` bounds the temporaries of one step (a few `[width, C, P, S]`
arrays): without it, a 10,000-taxon, 10,000-pattern gradient asked for 64 GiB.
"""

from __future__ import annotations

from functools import lru_cache

import equinox as eqx
import numpy as np
from jaxtyping import Int

from ._tree import Topology


class Schedule(eqx.Module):
    """Index arrays for the post-order (read forwards) and pre-order (backwards) passes.

    Step `i` of phase `j` covers slots `offsets[j] + i*widths[j]` onwards.
    `branch_index[k]` says which entry of the user's branch lengths kernel node
    `k` uses; `num_branches` (one past the last) means a zero-length branch.
    """

    nodes: Int[np.ndarray, " slots"]
    children: Int[np.ndarray, "slots 2"]
    steps: Int[np.ndarray, " phases"]
    offsets: Int[np.ndarray, " phases"]
    branch_index: Int[np.ndarray, " kernel_nodes"]
    widths: tuple[int, ...] = eqx.field(static=True)
    num_tips: int = eqx.field(static=True)

    @property
    def sentinel(self) -> int:
        return 2 * self.num_tips - 1


def phase_widths(num_tips: int, max_width: int | None = None) -> tuple[int, ...]:
    """Powers of two from the widest possible level (N/2 for a binary tree), at most `max_width`, down to 1."""
    top = 1 << max(0, (max(num_tips // 2, 1) - 1).bit_length())
    if max_width is not None:
        top = min(top, 1 << max(0, max_width.bit_length() - 1))
    return tuple(1 << k for k in range(top.bit_length() - 1, -1, -1))


def _binarize(topology: Topology):
    """Kernel parent array and, per kernel node, the user node whose branch it takes (-1: none)."""
    n = topology.num_tips
    kernel_parent: list[int] = [-1] * n
    user_of: list[int] = list(range(n))
    kernel_of = {t: t for t in range(n)}
    for node in range(n, topology.num_nodes):  # children always precede parents
        kids = [kernel_of[c] for c in topology.children[node]]
        while len(kids) > 2:  # join the last two under a zero-length node
            new = len(kernel_parent)
            kernel_parent.append(-1)
            user_of.append(-1)
            b, c = kids.pop(), kids.pop()
            kernel_parent[b] = kernel_parent[c] = new
            kids.append(new)
        if len(kids) == 1:  # a unifurcation: merge it into its child
            kernel_of[node] = kids[0]
            continue
        new = len(kernel_parent)
        kernel_parent.append(-1)
        user_of.append(node)
        for k in kids:
            kernel_parent[k] = new
        kernel_of[node] = new
    return np.asarray(kernel_parent), np.asarray(user_of)


def build_schedule(topology: Topology, max_width: int | None = None) -> Schedule:
    """The schedule of `topology`, steps at most `max_width` nodes wide (cached: topologies are hashable)."""
    return _cached_schedule(topology, max_width)


@lru_cache(maxsize=256)
def _cached_schedule(topology: Topology, max_width: int | None) -> Schedule:
    n = topology.num_tips
    parent, user_of = _binarize(topology)
    num_kernel = 2 * n - 1
    assert len(parent) == num_kernel, "binarized tree must have 2N-1 nodes"
    sentinel = num_kernel

    kids = np.full((num_kernel + 1, 2), sentinel, np.int64)
    filled = np.zeros(num_kernel + 1, np.int64)
    for node, up in enumerate(parent):
        if up >= 0:
            kids[up, filled[up]] = node
            filled[up] += 1
    level = np.zeros(num_kernel, np.int64)
    for node in range(n, num_kernel):
        level[node] = 1 + max(level[kids[node, 0]], level[kids[node, 1]])

    widths = phase_widths(n, max_width)
    internal = np.arange(n, num_kernel)
    by_level = [internal[level[n:] == lv] for lv in range(1, level.max() + 1)] if n > 1 else []
    slots: list[np.ndarray] = []
    steps = np.zeros(len(widths), np.int64)
    offsets = np.zeros(len(widths), np.int64)
    phase, used = 0, 0
    for members in by_level:
        while phase + 1 < len(widths) and widths[phase + 1] >= len(members):
            phase += 1
            offsets[phase] = used
        w = widths[phase]
        count = -(-len(members) // w)
        padded = np.full(count * w, sentinel, np.int64)
        padded[: len(members)] = members
        slots.append(padded)
        steps[phase] += count
        used += count * w
    for later in range(phase + 1, len(widths)):
        offsets[later] = used
    capacity = 2 * max(n - 1, 1) + widths[0]  # every level pads to < 2x its width
    nodes = np.full(capacity, sentinel, np.int64)
    if slots:
        flat = np.concatenate(slots)
        nodes[: len(flat)] = flat

    num_user = topology.num_nodes
    branch_index = np.where(user_of >= 0, user_of, num_user)
    branch_index = np.append(branch_index, num_user)  # the sentinel's branch: zero length
    return Schedule(
        nodes=nodes.astype(np.int32),
        children=kids[nodes].astype(np.int32),
        steps=steps.astype(np.int32),
        offsets=offsets.astype(np.int32),
        branch_index=branch_index.astype(np.int32),
        widths=widths,
        num_tips=n,
    )
