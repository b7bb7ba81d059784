"""Nucleotide models, states ordered A, C, G, T.

Exchangeabilities follow IQ-TREE's conventions: GTR has rates for AC, AG, AT,
CG, CT, GT (only ratios matter); HKY85 and K80 have transition/transversion
ratio `kappa`; TN93 has separate purine (A<->G) and pyrimidine (C<->T) ratios.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._alphabet import DNA, Alphabet
from ._base import SubstitutionModel

_PAIRS = ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3))  # AC AG AT CG CT GT


def _symmetric(six: Float[Array, " 6"]) -> Float[Array, "4 4"]:
    rows = jnp.array([i for i, _ in _PAIRS])
    cols = jnp.array([j for _, j in _PAIRS])
    r = jnp.zeros((4, 4), six.dtype).at[rows, cols].set(six)
    return r + r.T


def _equal_frequencies():
    return jnp.full(4, 0.25)


class GTR(SubstitutionModel):
    """General time-reversible: `rates` for AC, AG, AT, CG, CT, GT."""

    rates: Float[Array, " 6"]
    frequencies: Float[Array, " 4"]
    alphabet: Alphabet = eqx.field(static=True, default=DNA)

    def exchangeabilities(self):
        return _symmetric(self.rates)


class TN93(SubstitutionModel):
    """Tamura & Nei (1993): purine and pyrimidine transition ratios."""

    kappa_purine: Float[Array, ""]
    kappa_pyrimidine: Float[Array, ""]
    frequencies: Float[Array, " 4"]
    alphabet: Alphabet = eqx.field(static=True, default=DNA)

    def exchangeabilities(self):
        one = jnp.ones_like(self.kappa_purine)
        return _symmetric(jnp.stack([one, self.kappa_purine, one, one, self.kappa_pyrimidine, one]))


class HKY85(SubstitutionModel):
    """Hasegawa, Kishino & Yano (1985): one transition/transversion ratio `kappa`."""

    kappa: Float[Array, ""]
    frequencies: Float[Array, " 4"]
    alphabet: Alphabet = eqx.field(static=True, default=DNA)

    def exchangeabilities(self):
        one = jnp.ones_like(self.kappa)
        return _symmetric(jnp.stack([one, self.kappa, one, one, self.kappa, one]))


class K80(HKY85):
    """Kimura (1980): HKY85 with equal frequencies."""

    def __init__(self, kappa, frequencies=None):
        self.kappa = jnp.asarray(kappa, float)
        self.frequencies = _equal_frequencies() if frequencies is None else jnp.asarray(frequencies)


class F81(SubstitutionModel):
    """Felsenstein (1981): equal exchangeabilities, free frequencies."""

    frequencies: Float[Array, " 4"]
    alphabet: Alphabet = eqx.field(static=True, default=DNA)

    def exchangeabilities(self):
        return jnp.ones((4, 4), self.frequencies.dtype)


class JC69(F81):
    """Jukes & Cantor (1969): F81 with equal frequencies."""

    def __init__(self, frequencies=None):
        self.frequencies = _equal_frequencies() if frequencies is None else jnp.asarray(frequencies)
