"""The likelihood kernel's passes as XLA FFI custom calls on the CPU (C++, `_cpu/peeling.cc`).

XLA runs the JAX kernels of `_peeling` and `_preorder` as many small ops in
while loops, which on a CPU costs far more than the arithmetic for small
trees. These custom calls run a whole pass in one call, on the same arrays:

- `post_order(transition, tip_codes, tip_table, schedule, pi, w)` gives
  `(pattern log-likelihoods [B, P], partials [B, R + 1, C, P, S])`, as
  `_peeling.post_order_partials` followed by `log_likelihoods_from`. Only the
  rows of real slots are written: the sentinel and padding rows of `partials`
  are unspecified (no pass reads them).
- `pre_order_cotangents(transition, tip_codes, tip_table, schedule, pi, w,
  partials, g)` gives `(d_transition [B, L, C, S, S], d_pi [B, S], d_w [B, C],
  d_tips [N + 1, P, S])` for the pattern cotangent `g [B, P]`, as
  `_kernel._backward` (before its segment sum of `d_tips` into the tip table);
  `d_tips` is summed over the batch, and the sentinel's and padding ids'
  cotangents are zero.
- `log_likelihoods(...)`: the post-order keeping no partials (each tree's rows
  live in a stack of about log2(N) rows per block of patterns, in cache), and
  `cotangents(..., g)`: `pre_order_cotangents` without the partials, which it
  recomputes block by block in cache just before the pre-order of that block.
  No `[B, R + 1, C, P, S]` buffer is ever written: on a CPU, recomputing is
  cheaper than writing and re-reading it (and the memory is the inputs').
- `update_partials(...)`: the incremental post-order of `_update.py` (an
  operation list per tree, partials by node id in two buffers, updated in
  place), computing only the listed nodes.
- `pattern_log_likelihoods(transition, pi, w, tip_codes, tip_table, schedule)`:
  a drop-in for `_kernel.pattern_log_likelihoods` under `jax.custom_vjp` made
  of the last two; `pattern_log_likelihoods_stored` the same from the first two.

Both passes are float64 or float32 (all floating inputs are cast to the dtype
of `transition`). The library is built by `pip install .` (setup.py); without
it `available()` is False and `unavailable_reason()` says why. Threads: the
blocks of patterns are split over up to `JAXPHYLO_CPU_THREADS` threads (default:
the CPU count, at most 8) when a pass is big enough; results do not depend on it.

Under `jax.vmap` the calls run once per batch element (`vmap_method="sequential"`):
any argument may carry the mapped axis (tip data included) and `d_tips` stays
per element, which folding the mapped axis into the kernel's own tree batch
could not give; each call is already a whole pass, so the loop costs little.
"""

from __future__ import annotations

import ctypes
import os
from importlib import metadata
from pathlib import Path

import jax
import jax.numpy as jnp

from ...tree import Schedule

_FOLDER = Path(__file__).resolve().with_name("cpp")
_TARGETS = {"post": "jaxphylo_post_order", "pre": "jaxphylo_pre_order_cotangents",
            "likelihood": "jaxphylo_log_likelihoods", "cotangents": "jaxphylo_cotangents"}
_UPDATE = "jaxphylo_update_partials"  # optional: libraries built before it lack it
_state: dict = {}


def _library_files() -> list[Path]:
    """The compiled library: beside this module, else in the installed distribution.

    The second case is a source checkout imported ahead of a non-editable install
    (`pip install . && python -m pytest` run in the checkout, as CI does).
    """
    if os.environ.get("JAXPHYLO_CPU_LIBRARY"):  # another build, for development
        return [Path(os.environ["JAXPHYLO_CPU_LIBRARY"])]
    patterns = ("_peeling_ffi*.so", "_peeling_ffi*.pyd", "_peeling_ffi*.dylib")
    here = sorted(p for pattern in patterns for p in _FOLDER.glob(pattern))
    if here:
        return here
    found = []  # every jaxphylo on the path (the checkout's own egg-info lists no library)
    for distribution in metadata.distributions():
        if (distribution.metadata["Name"] or "").lower() == "jaxphylo":
            found += [Path(f.locate()) for f in distribution.files or []
                      if f.name.startswith("_peeling_ffi") and f.suffix in (".so", ".pyd", ".dylib")]
    return sorted(p for p in found if p.exists())


def _load() -> str | None:
    """Load and register the custom calls once; the reason they are unavailable, or None."""
    if "reason" in _state:
        return _state["reason"]
    reason = None
    files = _library_files()
    if not files:
        reason = (f"no compiled library _peeling_ffi*.so in {_FOLDER} "
                  "(build it with `pip install .` or `python setup.py build_ext --inplace`)")
    else:
        try:
            library = ctypes.cdll.LoadLibrary(str(files[0]))
            for target in _TARGETS.values():
                jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, target)), platform="cpu")
            if hasattr(library, _UPDATE):
                jax.ffi.register_ffi_target(_UPDATE, jax.ffi.pycapsule(getattr(library, _UPDATE)), platform="cpu")
            _state["library"] = library
        except (OSError, AttributeError) as error:
            reason = f"could not load {files[0].name}: {error}"
    _state["reason"] = reason
    return reason


def available() -> bool:
    """Whether the compiled custom calls can be used (on the CPU backend)."""
    return _load() is None


def unavailable_reason() -> str | None:
    """Why `available()` is False (None when it is True)."""
    return _load()


def _require() -> None:
    reason = _load()
    if reason is not None:
        raise RuntimeError(f"jaxphylo CPU kernel unavailable: {reason}")


def _float_dtype(transition) -> jnp.dtype:
    dtype = jnp.dtype(transition.dtype)
    if dtype not in (jnp.dtype(jnp.float64), jnp.dtype(jnp.float32)):
        raise TypeError(f"the CPU kernel takes float64 or float32, not {dtype}")
    return dtype


def _common(transition, tip_codes, tip_table, schedule: Schedule, root_frequencies, category_weights):
    dtype = _float_dtype(transition)
    return (
        jnp.asarray(transition),
        jnp.asarray(tip_codes, jnp.int32),
        jnp.asarray(tip_table, dtype),
        jnp.asarray(schedule.children, jnp.int32),
        jnp.asarray(schedule.root_row, jnp.int32),
        jnp.asarray(root_frequencies, dtype),
        jnp.asarray(category_weights, dtype),
    )


def _shapes(args):
    transition, codes = args[0], args[1]
    batch, ids, categories, states, _ = transition.shape
    return transition.dtype, batch, ids, categories, states, codes.shape[0], codes.shape[1]


def post_order(transition, tip_codes, tip_table, schedule: Schedule, root_frequencies, category_weights):
    """`(log L_c [B, P], partials [B, R + 1, C, P, S])` by one custom call (see the module docstring)."""
    _require()
    args = _common(transition, tip_codes, tip_table, schedule, root_frequencies, category_weights)
    dtype, batch, _, categories, states, _, patterns = _shapes(args)
    rows = schedule.num_slots + 1
    call = jax.ffi.ffi_call(
        _TARGETS["post"],
        (jax.ShapeDtypeStruct((batch, patterns), dtype),
         jax.ShapeDtypeStruct((batch, rows, categories, patterns, states), dtype)),
        vmap_method="sequential",
    )
    return tuple(call(*args))


def log_likelihoods(transition, tip_codes, tip_table, schedule: Schedule, root_frequencies, category_weights):
    """`log L_c [B, P]` by one custom call that keeps no partials."""
    _require()
    args = _common(transition, tip_codes, tip_table, schedule, root_frequencies, category_weights)
    dtype, batch, *_, patterns = _shapes(args)
    call = jax.ffi.ffi_call(_TARGETS["likelihood"], jax.ShapeDtypeStruct((batch, patterns), dtype),
                            vmap_method="sequential")
    return call(*args)


def _cotangent_shapes(args):
    dtype, batch, ids, categories, states, tips_plus_one, patterns = _shapes(args)
    return (jax.ShapeDtypeStruct((batch, ids, categories, states, states), dtype),
            jax.ShapeDtypeStruct((batch, states), dtype),
            jax.ShapeDtypeStruct((batch, categories), dtype),
            jax.ShapeDtypeStruct((tips_plus_one, patterns, states), dtype))


def pre_order_cotangents(transition, tip_codes, tip_table, schedule: Schedule, root_frequencies, category_weights,
                         partials, pattern_cotangent):
    """`(d_transition, d_pi, d_w, d_tips)` for the pattern cotangent `g [B, P]`, from `post_order`'s partials."""
    _require()
    args = _common(transition, tip_codes, tip_table, schedule, root_frequencies, category_weights)
    dtype = args[0].dtype
    call = jax.ffi.ffi_call(_TARGETS["pre"], _cotangent_shapes(args), vmap_method="sequential")
    return tuple(call(*args, jnp.asarray(partials, dtype), jnp.asarray(pattern_cotangent, dtype)))


def cotangents(transition, tip_codes, tip_table, schedule: Schedule, root_frequencies, category_weights,
               pattern_cotangent):
    """`(d_transition, d_pi, d_w, d_table [K, S])`: as `pre_order_cotangents` followed by the segment sum of
    `d_tips` into the tip table, recomputing the partials block by block instead of reading them."""
    _require()
    args = _common(transition, tip_codes, tip_table, schedule, root_frequencies, category_weights)
    dtype = args[0].dtype
    shapes = _cotangent_shapes(args)[:3] + (jax.ShapeDtypeStruct(args[2].shape, dtype),)
    call = jax.ffi.ffi_call(_TARGETS["cotangents"], shapes, vmap_method="sequential")
    return tuple(call(*args, jnp.asarray(pattern_cotangent, dtype)))


def _table_cotangent(tip_codes, tip_table, d_tips):
    num_tips, states = tip_codes.shape[0] - 1, tip_table.shape[1]
    return jax.ops.segment_sum(d_tips[:num_tips].reshape(-1, states), tip_codes[:num_tips].reshape(-1),
                               num_segments=tip_table.shape[0])


def _input_cotangents(residuals, d_transition, d_pi, d_w, d_table):
    transition, root_frequencies, category_weights, tip_codes, tip_table = residuals[:5]
    return (d_transition.astype(transition.dtype), d_pi.astype(root_frequencies.dtype),
            d_w.astype(category_weights.dtype), None, d_table.astype(tip_table.dtype), None)


@jax.custom_vjp
def pattern_log_likelihoods(transition, root_frequencies, category_weights, tip_codes, tip_table,
                            schedule: Schedule):
    """`log L_c [B, P]`, as `_kernel.pattern_log_likelihoods`; the gradient recomputes the partials (`cotangents`)."""
    return log_likelihoods(transition, tip_codes, tip_table, schedule, root_frequencies, category_weights)


def _forward(transition, root_frequencies, category_weights, tip_codes, tip_table, schedule):
    value = log_likelihoods(transition, tip_codes, tip_table, schedule, root_frequencies, category_weights)
    return value, (transition, root_frequencies, category_weights, tip_codes, tip_table, schedule)


def _backward(residuals, pattern_cotangent):
    transition, root_frequencies, category_weights, tip_codes, tip_table, schedule = residuals
    return _input_cotangents(residuals, *cotangents(transition, tip_codes, tip_table, schedule, root_frequencies,
                                                    category_weights, pattern_cotangent))


pattern_log_likelihoods.defvjp(_forward, _backward)


@jax.custom_vjp
def pattern_log_likelihoods_stored(transition, root_frequencies, category_weights, tip_codes, tip_table,
                                   schedule: Schedule):
    """`log L_c [B, P]` as `pattern_log_likelihoods`, keeping the partials for the gradient (`post_order`)."""
    return log_likelihoods(transition, tip_codes, tip_table, schedule, root_frequencies, category_weights)


def _forward_stored(transition, root_frequencies, category_weights, tip_codes, tip_table, schedule):
    value, partials = post_order(transition, tip_codes, tip_table, schedule, root_frequencies, category_weights)
    return value, (transition, root_frequencies, category_weights, tip_codes, tip_table, schedule, partials)


def _backward_stored(residuals, pattern_cotangent):
    transition, root_frequencies, category_weights, tip_codes, tip_table, schedule, partials = residuals
    d_transition, d_pi, d_w, d_tips = pre_order_cotangents(
        transition, tip_codes, tip_table, schedule, root_frequencies, category_weights, partials, pattern_cotangent)
    return _input_cotangents(residuals, d_transition, d_pi, d_w, _table_cotangent(tip_codes, tip_table, d_tips))


pattern_log_likelihoods_stored.defvjp(_forward_stored, _backward_stored)


def has_update() -> bool:
    """Whether the loaded library has the operation-list kernel (`jaxphylo_update_partials`)."""
    return available() and hasattr(_state["library"], _UPDATE)


def update_partials(transition, tip_codes, tip_table, partials, log_scales, buffer, children, operations, counts,
                    root, root_frequencies, category_weights):
    """`_update.update_partials` by one custom call that computes only the listed nodes, in place: the partials
    and log scale factors are outputs aliased to their inputs (under jit with the buffers donated or a loop
    carry, no copy)."""
    _require()
    dtype = _float_dtype(transition)
    int32 = lambda x: jnp.asarray(x, jnp.int32)  # noqa: E731
    args = (jnp.asarray(transition), int32(tip_codes), jnp.asarray(tip_table, dtype), jnp.asarray(partials, dtype),
            jnp.asarray(log_scales, dtype), int32(buffer), int32(children), int32(operations), int32(counts),
            int32(root), jnp.asarray(root_frequencies, dtype), jnp.asarray(category_weights, dtype))
    shapes = (jax.ShapeDtypeStruct((transition.shape[0], tip_codes.shape[1]), dtype),
              jax.ShapeDtypeStruct(partials.shape, dtype), jax.ShapeDtypeStruct(log_scales.shape, dtype))
    loglik, partials, log_scales = jax.ffi.ffi_call(_UPDATE, shapes, input_output_aliases={3: 1, 4: 2})(*args)
    return partials, log_scales, loglik
