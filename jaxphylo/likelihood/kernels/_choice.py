"""Which kernel runs a pass: chosen here, and only here.

- `cpu`: the C++ XLA FFI kernel (`_cpu`), on the CPU backend when it was built;
- `pallas`: the Pallas/Triton kernels (`_pallas`), opt-in on a GPU with `JAXPHYLO_KERNEL=pallas`, except the
  samplers' operation-list walk, a GPU's default (`update_backend`);
- `xla`: the level-batched XLA passes (`_xla`, `_preorder`), everywhere else and the reference.
"""

from __future__ import annotations

import os

import jax
from jaxtyping import Array, Float, Int

from ..._errors import InputError
from ...tree import Schedule
from . import _cpu, _pallas, _update, _xla

KERNEL_ENV = "JAXPHYLO_KERNEL"
UPDATE_ENV = "JAXPHYLO_UPDATE"  # the Pallas operation-list update: `walk` (default) or `levels`


def cpu_wanted() -> bool:
    """Whether whole likelihood calls go to the C++ kernel: on the CPU backend, when it was built."""
    return jax.default_backend() == "cpu" and _cpu.available()


def kernel_setting() -> str | None:
    """`JAXPHYLO_KERNEL` (`pallas` or `xla`), or None when it is not set."""
    choice = os.environ.get(KERNEL_ENV)
    if choice is None:
        return None
    if choice.lower() not in ("pallas", "xla"):
        raise InputError(f"{KERNEL_ENV}={choice!r}: expected 'pallas' or 'xla'")
    return choice.lower()


def pallas_wanted(states: int) -> bool:
    """Whether the passes use the Pallas kernels for `states` states: `JAXPHYLO_KERNEL=pallas` (default `xla`).

    Opt-in. On an H100 they are 1.15-1.5x faster on single trees and 2.4-3.3x on batches of trees (MC³), but
    NUTS with 4 chains under `vmap` took 4.1 ms per gradient step against XLA's 2.1, and Triton compiles
    each program 2-6x longer (README, "Pallas kernels")."""
    return kernel_setting() == "pallas" and states <= _pallas.MAX_STATES


def post_order_partials(
    transition: Float[Array, "B ids C S S"],
    tip_codes: Int[Array, "tips_plus_one patterns"],
    tip_table: Float[Array, "codes S"],
    schedule: Schedule,
    static_steps=None,
) -> tuple[Float[Array, "B rows C patterns S"], Float[Array, "B rows patterns"]]:
    """Rescaled partials of every slot (and the sentinel row) and their per-pattern log scale factors, by
    Pallas when wanted, else XLA (same outputs, same layout)."""
    if pallas_wanted(tip_table.shape[1]):
        return _pallas.post_order_partials(transition, tip_codes, tip_table, schedule, static_steps)
    return _xla.post_order_partials(transition, tip_codes, tip_table, schedule, static_steps)



def update_backend(states: int) -> str:
    """Which kernel recomputes an operation list: `cpu` when `cpu_wanted()` (the C++ kernel); `pallas`, one
    launch walking every chain's list, for up to `VECTOR_STATES` states on a GPU unless `JAXPHYLO_KERNEL=xla`
    (and anywhere with `JAXPHYLO_KERNEL=pallas`: interpreted on a CPU), or with `JAXPHYLO_UPDATE=levels` one
    Pallas launch per dirty level (`levels`); else `xla`, a loop over the longest list.

    The Pallas walk is the GPU's default here, unlike for the passes: on an H200 a generation of 8 chains took
    0.44 ms against the XLA loop's 0.93 on DS1 and 0.86 against 2.51 on carnivores, with the same compile time
    (`benchmarks/incremental.py`; README, "Kept partials"). A launch per dirty level took 0.92 and 1.80 ms
    there, against the walk's 0.49 and 0.86 in the same run (`incremental-levels-h200.json`): the walk stays."""
    if cpu_wanted() and _cpu.has_update():
        return "cpu"
    setting = kernel_setting()
    if _pallas.blocked(states) or setting == "xla":
        return "xla"
    if setting == "pallas" or jax.default_backend() == "gpu":
        return "levels" if update_schedule() == "levels" else "pallas"
    return "xla"


FUSED_MAX_TILE_CATEGORIES = 16  # pattern tiles x rate categories up to which a fused program is faster


def fuses_generations(states: int, patterns: int, categories: int) -> bool:
    """Whether a sampler runs many generations in one launch (`_pallas.fused_generations`): where the operation
    lists go to Pallas (`update_backend`: a GPU, up to `VECTOR_STATES` states), for data a single program per
    chain covers quickly, its pattern tiles times rate categories at most `FUSED_MAX_TILE_CATEGORIES` (it
    visits them in turn). On an H200 (benchmarks/mc3.py --fused, 8 chains) a branch-multiplier generation took
    0.065 ms fused against 0.143 one per launch on DS1 (8 tiles, JC) but 2.11 against 0.54 on carnivores (44
    tiles x 4 categories)."""
    tiles = -(-patterns // _pallas.update_tile(patterns))
    return update_backend(states) in ("pallas", "levels") and tiles * categories <= FUSED_MAX_TILE_CATEGORIES


def update_schedule() -> str:
    """`JAXPHYLO_UPDATE`: how the Pallas update visits the dirty nodes, `walk` (default) or `levels`."""
    choice = os.environ.get(UPDATE_ENV, "walk").lower()
    if choice not in ("walk", "levels"):
        raise InputError(f"{UPDATE_ENV}={choice!r}: expected 'walk' or 'levels'")
    return choice


def update_partials(transition, tip_codes, tip_table, partials, log_scales, buffer, children, operations, counts,
                    depths, root, root_frequencies, category_weights):
    """Recompute the nodes of an operation list in place (`_update`'s contract; `depths [B, Q]`, each listed
    node's number of ancestors, orders a launch per level) by `update_backend`'s kernel."""
    backend = update_backend(tip_table.shape[1])
    arguments = (transition, tip_codes, tip_table, partials, log_scales, buffer, children, operations, counts)
    if backend == "levels":
        return _pallas.update_levels(*arguments, depths, root, root_frequencies, category_weights)
    return {"cpu": _cpu, "pallas": _pallas, "xla": _update}[backend].update_partials(
        *arguments, root, root_frequencies, category_weights)
