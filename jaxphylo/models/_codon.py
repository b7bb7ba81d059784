"""Codon models: Goldman & Yang (1994) M0 with kappa and omega.

`Q_ij = pi_j * kappa^[transition] * omega^[nonsynonymous]` when codons i and j
differ at exactly one position, zero otherwise; scaled to one expected
substitution per codon per unit time (as PAML's codeml does).
"""

from __future__ import annotations

from functools import lru_cache

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ..data import Alphabet
from ._base import SubstitutionModel

_TRANSITIONS = {frozenset("AG"), frozenset("CT")}


@lru_cache(maxsize=None)
def codon_change_classes(alphabet: Alphabet) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Masks over codon pairs: one-nucleotide neighbours, transitions, nonsynonymous."""
    codons, aa = alphabet.states, alphabet.amino_acid_of
    n = len(codons)
    single, transition, nonsyn = (np.zeros((n, n), bool) for _ in range(3))
    for i, a in enumerate(codons):
        for j, b in enumerate(codons):
            diffs = [(x, y) for x, y in zip(a, b) if x != y]
            if len(diffs) == 1:
                single[i, j] = True
                transition[i, j] = frozenset(diffs[0]) in _TRANSITIONS
                nonsyn[i, j] = aa[i] != aa[j]
    return single, transition, nonsyn


class GY94(SubstitutionModel):
    """Goldman–Yang codon model (M0): transition/transversion `kappa`, dN/dS `omega`."""

    kappa: Float[Array, ""]
    omega: Float[Array, ""]
    frequencies: Float[Array, " codons"]
    alphabet: Alphabet = eqx.field(static=True)

    def exchangeabilities(self):
        single, transition, nonsyn = (jnp.asarray(m) for m in codon_change_classes(self.alphabet))
        r = jnp.where(transition, self.kappa, 1.0) * jnp.where(nonsyn, self.omega, 1.0)
        return jnp.where(single, r, 0.0)
