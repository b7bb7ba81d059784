"""The precision of every matrix product in the likelihood, its gradient and the models.

GPUs run float32 products in TF32 (a 10-bit mantissa) unless told otherwise,
which costs three digits of log L for 20- and 61-state models (issue #17). So
every contraction asks for `product_precision()`, `HIGHEST` by default: full
float32 (and float64) arithmetic. `benchmarks/float32.py` switches it to
measure what full precision costs next to TF32; no public option lowers it.
"""

from jax import lax

_PRECISION = [lax.Precision.HIGHEST]


def product_precision() -> lax.Precision:
    """The precision passed to every `einsum`/`matmul` of the likelihood and the models (read at trace time)."""
    return _PRECISION[0]


def set_product_precision(precision: lax.Precision) -> None:
    """For benchmarks only: change the precision of products traced from now on."""
    _PRECISION[0] = precision
