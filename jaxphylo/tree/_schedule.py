"""The traversal schedule: a topology turned into padded index arrays, on the device.

Kernels see *binary rooted* trees ("kernel trees") given by a parent array over
`M = 2N-1` nodes: tips `0..N-1`, internal nodes after, the root's parent `-1`.
Polytomies (the trifurcating root of an unrooted tree included) are resolved on
the host with zero-length branches, which leave the likelihood unchanged.

Internal nodes are processed in *steps*, each computing nodes whose children
are done, grouped in *phases* of fixed widths `W_0 > W_1 > ... > 1` (powers
of two). `device_schedule` (a batch of topologies, inside jit) cuts the tree
level by level (a node's level is one more than its highest child's): a level
goes to the narrowest phase it fits in (never back to a wider one), split into
several steps if it is wider. `host_schedule` (one known topology) packs each
step with the ready nodes farthest from the root, which pads less and takes
fewer steps. Either way a step is at least half full, so `R = 2(N-1) + W_0`
slots always suffice, and a program compiled for one runs the other.

Slots are the rows of the partials buffers, so every step writes one
contiguous block of rows. The kernels name everything by *layout id*: tip `t`
is `t`, slot `r` is `N + r`, and `N + R` is a sentinel (a row of ones, a
zero-length branch) that padding slots take as their children. Phase widths
and `R` depend only on `N` and `max_width`; everything else is data, computed
by `device_schedule` inside jit from the parent array, so every topology of N
taxa runs one compiled program, and moves that edit parent arrays on the
device never go back to the host (`trim_slots` cuts a one-tree schedule to the
slots its topology uses, for callers that compile per topology anyway). `max_width` bounds the temporaries of one
step (a few `[width, C, P, S]` arrays).
"""

from __future__ import annotations

import math

from functools import lru_cache, partial

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Int

from ._kernel_form import binarize
from ._topology import Topology


class Schedule(eqx.Module):
    """Index arrays of a batch of kernel trees for the post-order (forwards) and pre-order (backwards) passes.

    Step `i` of phase `j` of tree `b` covers slots `offsets[b, j] + i*widths[j]` onwards.
    `layout[b, id]` is the kernel node at layout id `id` (`M`, the kernel
    sentinel, for padding), so `P[layout]` puts transition matrices in layout order.
    """

    children: Int[Array, "batch slots 2"]
    layout: Int[Array, "batch ids"]
    steps: Int[Array, "batch phases"]
    offsets: Int[Array, "batch phases"]
    root_row: Int[Array, " batch"]
    widths: tuple[int, ...] = eqx.field(static=True)
    num_tips: int = eqx.field(static=True)

    @property
    def num_slots(self) -> int:
        return self.children.shape[-2]

    @property
    def batch_size(self) -> int:
        return self.children.shape[0]


def phase_widths(num_tips: int, max_width: int | None = None) -> tuple[int, ...]:
    """Powers of two from the widest possible level (N/2 for a binary tree), at most `max_width`, down to 1."""
    top = 1 << max(0, (max(num_tips // 2, 1) - 1).bit_length())
    if max_width is not None:
        top = min(top, 1 << max(0, max_width.bit_length() - 1))
    return tuple(1 << k for k in range(top.bit_length() - 1, -1, -1))


def num_slots(num_tips: int, widths: tuple[int, ...]) -> int:
    return 2 * max(num_tips - 1, 1) + widths[0]


def kernel_children(parent: Int[Array, " M"]) -> Int[Array, "M 2"]:
    """Both children of every node of a binary tree (`M` for a tip), by segment min and max."""
    m = parent.shape[0]
    up = jnp.where(parent < 0, m, parent)
    node = jnp.arange(m, dtype=parent.dtype)
    first = jax.ops.segment_min(node, up, num_segments=m + 1)[:m]
    second = jax.ops.segment_max(node, up, num_segments=m + 1)[:m]
    has_children = first <= second
    return jnp.where(has_children[:, None], jnp.stack([first, second], axis=1), m)


def node_levels(children: Int[Array, "M 2"]) -> Int[Array, " M"]:
    """Level of every node: its height above its deepest tip (tips 0), `1 + max(children)`.

    By pointer doubling, in `ceil(log2 M)` unrolled rounds of gathers and
    segment maxima (a loop until nothing changes would cost a device loop
    iteration, with its launch and host round trip, per level): the depth of
    every node by list ranking, then the deepest depth below every node, each
    round passing it `2^k` generations up; the level is the difference.
    """
    m = children.shape[0]
    node = jnp.arange(m, dtype=children.dtype)
    parent = jnp.full(m + 1, -1, children.dtype).at[children.reshape(-1)].set(jnp.repeat(node, 2), mode="drop")[:m]
    rounds = max(1, math.ceil(math.log2(m)))
    depth, jump = (parent >= 0).astype(children.dtype), parent
    for _ in range(rounds):
        valid = jump >= 0
        depth = depth + jnp.where(valid, depth[jnp.maximum(jump, 0)], 0)
        jump = jnp.where(valid, jump[jnp.maximum(jump, 0)], -1)
    deepest, jump = depth, parent
    for _ in range(rounds):
        passed = jax.ops.segment_max(deepest, jnp.where(jump >= 0, jump, m), num_segments=m + 1)[:m]
        deepest = jnp.maximum(deepest, passed)
        jump = jnp.where(jump >= 0, jump[jnp.maximum(jump, 0)], -1)
    return jnp.where(children[:, 0] < m, deepest - depth, 0)


@partial(jax.jit, static_argnames=("widths",))
def device_schedule(parent: Int[Array, "batch M"], widths: tuple[int, ...]) -> Schedule:
    """The schedule of a batch of binary rooted trees (parent arrays over the same `N` tips), inside jit."""
    return jax.vmap(lambda p: _one_schedule(p, widths))(parent)


def _one_schedule(parent, widths):
    m = parent.shape[0]
    n = (m + 1) // 2
    r = num_slots(n, widths)
    width = jnp.asarray(widths, jnp.int32)
    kids = kernel_children(parent).astype(jnp.int32)
    level = node_levels(kids)
    internal = jnp.arange(m) >= n

    # Level sizes, and each level's phase: the narrowest that fits, never widening again (a cumulative max).
    count = jnp.zeros(n + 1, jnp.int32).at[jnp.where(internal, level, 0)].add(internal.astype(jnp.int32))
    fits = jnp.sum(width[None, :] >= count[:, None], axis=1) - 1
    phase = lax.cummax(jnp.where(count > 0, fits, 0))
    level_width = width[phase]
    level_slots = -(-count // level_width) * level_width
    level_start = jnp.cumsum(level_slots) - level_slots
    steps = jax.ops.segment_sum(level_slots // level_width, phase, num_segments=len(widths))
    offsets = jnp.cumsum(steps * width) - steps * width

    # A node's slot: its level's first slot plus its rank among that level's nodes.
    order = jnp.argsort(jnp.where(internal, level, n + 1), stable=True)
    sorted_level = level[order]
    first_in_level = jnp.cumsum(count) - count
    rank = jnp.arange(m) - first_in_level[sorted_level]
    slot = jnp.zeros(m, jnp.int32).at[order].set((level_start[sorted_level] + rank).astype(jnp.int32))

    layout_id = jnp.where(internal, n + slot, jnp.arange(m, dtype=jnp.int32))
    layout_id = jnp.append(layout_id, n + r)  # the sentinel
    node_at_slot = jnp.full(r, m, jnp.int32).at[jnp.where(internal, slot, r)].set(jnp.arange(m, dtype=jnp.int32),
                                                                                 mode="drop")
    children = layout_id[jnp.append(kids, jnp.full((1, 2), m, jnp.int32), axis=0)[node_at_slot]]
    layout = jnp.concatenate([jnp.arange(n, dtype=jnp.int32), node_at_slot, jnp.array([m], jnp.int32)])
    root = jnp.argmin(parent)  # the only negative entry
    return Schedule(children, layout, steps.astype(jnp.int32), offsets.astype(jnp.int32),
                    slot[root], widths, n)


def build_schedule(topology: Topology, max_width: int | None = None) -> Schedule:
    """The schedule of one topology (a batch of one), steps at most `max_width` nodes wide (cached)."""
    return _cached_schedule(topology, max_width)


@lru_cache(maxsize=256)
def _cached_schedule(topology: Topology, max_width: int | None) -> Schedule:
    parent, _ = binarize(topology)
    return host_schedule(np.asarray(parent), phase_widths(topology.num_tips, max_width))


def host_schedule(parent: Int[np.ndarray, " M"], widths: tuple[int, ...]) -> Schedule:
    """One known tree's schedule, computed by NumPy on the host and packed (a batch of one).

    A known topology needs no program: compiling `device_schedule` for one tree
    cost a fresh process about a second per taxon count, and its constants another
    thirty small programs, for what NumPy computes in a millisecond.

    The arrays mean what `device_schedule`'s mean, but steps are not cut level by
    level: each step takes the ready nodes (both children computed) farthest from
    the root, as many as its width allows (Hu's rule, which for unit tasks on an
    in-tree takes the fewest steps of any width), and the width halves while the
    ready nodes would fill at most half a step. The number of ready nodes never
    grows (a step's nodes make at most as many parents ready), so widths only
    narrow, as the phases require, and every step is at least half full. A level
    rounded up to a multiple of its width pads much more once the width is large:
    1,000 random taxa take 1,084 / 1,180 / 1,340 level slots at widths 16 / 32 / 64
    and 1,007 / 1,023 / 1,041 packed, in 66 / 36 / 24 steps instead of 78 / 50 / 36,
    and every slot is computed in both passes. On the device the packing would
    need a loop over steps, so batches keep the level schedule.
    """
    m = parent.shape[0]
    n = (m + 1) // 2
    r = num_slots(n, widths)
    node = np.arange(m, dtype=np.int32)
    up = np.where(parent < 0, m, parent)
    first, second = np.full(m + 1, m, np.int32), np.full(m + 1, -1, np.int32)
    np.minimum.at(first, up, node)
    np.maximum.at(second, up, node)
    has_children = first[:m] <= second[:m]
    kids = np.where(has_children[:, None], np.stack([first[:m], second[:m]], axis=1), m).astype(np.int32)
    internal = node >= n

    # Distance from the root, by sweeps down the tree (as many as it is high).
    depth = np.zeros(m + 1, np.int32)  # the last entry: above the root
    depth[m] = -1
    while True:
        deeper = depth[up] + 1
        if np.array_equal(deeper, depth[:m]):
            break
        depth[:m] = deeper
    depth = depth[:m]

    waiting = np.bincount(up[internal], minlength=m + 1)[:m]  # internal children not yet computed
    ready = node[internal & (waiting == 0)]
    slot = np.zeros(m, np.int32)
    steps = np.zeros(len(widths), np.int32)
    phase, start = 0, 0
    while ready.size:
        while widths[phase] > 1 and ready.size <= widths[phase] // 2:
            phase += 1
        width = widths[phase]
        ready = ready[np.lexsort((ready, -depth[ready]))]
        taken, ready = ready[:width], ready[width:]
        slot[taken] = start + np.arange(taken.size, dtype=np.int32)
        start += width
        steps[phase] += 1
        parents = parent[taken]
        parents = parents[parents >= 0]
        np.subtract.at(waiting, parents, 1)
        ready = np.concatenate([ready, np.unique(parents[waiting[parents] == 0])]).astype(np.int32)
    width = np.asarray(widths, np.int32)
    offsets = np.cumsum(steps * width) - steps * width

    layout_id = np.append(np.where(internal, n + slot, node), n + r).astype(np.int32)
    node_at_slot = np.full(r, m, np.int32)
    node_at_slot[slot[internal]] = node[internal]
    children = layout_id[np.append(kids, np.full((1, 2), m, np.int32), axis=0)[node_at_slot]]
    layout = np.concatenate([node[:n], node_at_slot, np.array([m], np.int32)])
    root = np.argmin(parent)
    return Schedule(children[None], layout[None], steps[None], offsets.astype(np.int32)[None],
                    slot[root][None], widths, n)


def trim_slots(schedule: Schedule) -> Schedule:
    """A host schedule with only the slots its steps use (and the sentinel after them).

    `device_schedule` must allow for any topology, `2(N-1) + W_0` slots; one
    known topology's steps use `offsets[-1] + steps[-1] * widths[-1]`, close to
    `N - 1`. The partials buffers have a row per slot, so this halves them
    (1,000 taxa: 2,015 rows become about 1,000). The slot count is then a
    property of the topology: for callers that compile per topology anyway
    (static step counts), not for those that share one program. One tree only:
    in a batch, a tree with fewer steps than the longest recomputes its root's
    block, which may reach past the slots the longest uses.
    """
    if schedule.batch_size != 1:
        raise ValueError(f"trim_slots takes the schedule of one tree, not of {schedule.batch_size}")
    steps, offsets = np.asarray(schedule.steps), np.asarray(schedule.offsets)
    used = int(offsets[0, -1] + steps[0, -1] * schedule.widths[-1])  # the last phase ends at the root
    n, slots = schedule.num_tips, schedule.num_slots
    children = np.asarray(schedule.children)[:, :used]
    children = np.where(children == n + slots, n + used, children)  # the sentinel's new id
    layout = np.asarray(schedule.layout)
    layout = np.concatenate([layout[:, :n + used], layout[:, -1:]], axis=1)
    return Schedule(children, layout, steps, offsets, np.asarray(schedule.root_row), schedule.widths, n)
