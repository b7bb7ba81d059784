"""Empirical amino-acid models: fixed exchangeabilities, states in ARNDCQEGHILKMFPSTWYV order.

Each model is a text file in `_empirical/` named after it: comment lines (`#`,
naming the paper and where the numbers were taken from), then the 190
exchangeabilities `R_ij` of the lower triangle row by row (R_RA; R_NA R_NR; ...)
and the model's 20 frequencies. `Q_ij = R_ij pi_j`, normalised to one
substitution per unit time (the scale of `R` is irrelevant). `Poisson` is a file
too: every exchangeability 1 and every frequency 1/20.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ..data import Alphabet, PROTEIN
from .._errors import ModelError
from ._base import SubstitutionModel

EMPIRICAL_MODELS = (
    "LG", "WAG", "JTT", "Dayhoff", "DCMut", "JTTDCMut", "mtREV", "mtMAM", "mtART", "mtZOA", "mtMet", "mtVer", "mtInv",
    "cpREV", "rtREV", "VT", "Blosum62", "PMB", "HIVb", "HIVw", "FLU", "FLAVI", "Q.pfam", "Q.pfam_gb", "Q.LG",
    "Q.plant", "Q.yeast", "Q.insect", "Q.mammal", "Q.bird", "Poisson",
)


@lru_cache(maxsize=None)
def empirical_matrix(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(exchangeabilities [20, 20], frequencies [20]) of a published model."""
    if name not in EMPIRICAL_MODELS:
        raise ModelError(f"unknown amino-acid model {name!r}; known: {', '.join(EMPIRICAL_MODELS)}")
    text = resources.files("jaxphylo.models").joinpath(f"_empirical/{name}.txt").read_text()
    numbers = np.array([float(x) for line in text.splitlines() if not line.startswith("#") for x in line.split()])
    r = np.zeros((20, 20))
    r[np.tril_indices(20, -1)] = numbers[:190]
    frequencies = numbers[190:210]
    return r + r.T, frequencies / frequencies.sum()


class EmpiricalAminoAcid(SubstitutionModel):
    """One of `EMPIRICAL_MODELS`; `frequencies` start at the model's own and may be replaced (+F)."""

    frequencies: Float[Array, " 20"]
    name: str = eqx.field(static=True)
    alphabet: Alphabet = eqx.field(static=True, default=PROTEIN)

    def __init__(self, name: str, frequencies=None):
        r, pi = empirical_matrix(name)
        self.name = name
        self.frequencies = jnp.asarray(pi if frequencies is None else frequencies)

    def exchangeabilities(self):
        return jnp.asarray(empirical_matrix(self.name)[0], self.frequencies.dtype)
