"""Walking a level schedule: the loop every backend's passes share (the operation list as data).

A pass is `body(carry, start, real, width)` run over every step of the
schedule (`level_loop`): a step reads its nodes' children (`step_children`)
and writes one contiguous block of rows of a `[B, rows, ...]` buffer
(`gather_rows`, `write_rows`). XLA, Pallas and the pre-order passes are
bodies for this loop; the C++ CPU kernel walks the same schedule arrays.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Float, Int

from ...tree import Schedule


def gather_rows(buffer: Float[Array, "B rows *rest"], start: Int[Array, " B"], width: int):
    """Rows `start .. start + width` of every tree's buffer."""
    return jax.vmap(lambda b, s: lax.dynamic_slice_in_dim(b, s, width))(buffer, start)


def write_rows(buffer: Float[Array, "B rows *rest"], block, start: Int[Array, " B"]):
    """Write a contiguous block of rows per tree (one in-place update when the batch is one tree)."""
    if buffer.shape[0] == 1:
        return lax.dynamic_update_slice_in_dim(buffer, block, start[0], axis=1)
    return jax.vmap(lambda b, x, s: lax.dynamic_update_slice_in_dim(b, x, s, 0))(buffer, block, start)


def level_loop(schedule: Schedule, body, carry, reverse=False, static_steps=None):
    """Run `body(carry, start [B], real [B], width)` over every step of the schedule.

    Trees of a batch share the loop: phase `j` runs the most steps any tree
    needs. A tree with fewer steps spends the surplus recomputing its root's
    block, which leaves every value as it was (`real` is False there, so that
    accumulators can skip it). Step counts are data, so any topology of N
    taxa shares one compiled program. `static_steps` gives Python counts
    instead (at least the real ones, `exact_steps`; None for a phase whose
    count stays data): fixed-length loops, which plain reverse-mode autodiff
    can pass through. Loops are never
    unrolled: on an H100 (float64, value and gradient,
    benchmarks/results/kernel-versions-gpu.json) unrolled passes were slower
    at every size but one (12 x 413: 0.89 ms against 0.73 looped; 1,000 x
    1,000: 10.4 against 4.5; 100 x 1,000: 1.29 against 1.51), compiled up to
    5x longer, and held up to 2.7x the memory.
    Measured on an H100 (benchmarks/results/likelihood-gpu.json, issue #19 notes):
    static counts padded to shared buckets cost more in extra steps and compile
    time than the while loops they save, so the default keeps counts as data.
    """
    phases = list(enumerate(schedule.widths))
    for j, width in reversed(phases) if reverse else phases:
        steps = schedule.steps[:, j]
        num_steps = jnp.max(steps) if static_steps is None or static_steps[j] is None else static_steps[j]

        def step(i, carry, j=j, width=width, steps=steps, num_steps=num_steps):
            i = num_steps - 1 - i if reverse else i
            real = i < steps
            start = jnp.where(real, schedule.offsets[:, j] + i * width, schedule.root_row)
            return body(carry, start, real, width)

        carry = lax.fori_loop(0, num_steps, step, carry)
    return carry


def exact_steps(schedule: Schedule) -> tuple[int, ...]:
    """The schedule's step counts per phase as Python ints (the most any tree of the batch needs)."""
    return tuple(int(k) for k in np.max(np.asarray(schedule.steps), axis=0))


def step_children(schedule: Schedule, start, width):
    """`[B, W, 2]` layout ids of the children of the block's nodes."""
    return gather_rows(schedule.children, start, width)
