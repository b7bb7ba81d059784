"""Nucleotide models, states ordered A, C, G, T.

Exchangeabilities follow IQ-TREE's conventions: GTR has rates for AC, AG, AT,
CG, CT, GT (only ratios matter); HKY85 and K80 have transition/transversion
ratio `kappa`; TN93 has separate purine (A<->G) and pyrimidine (C<->T) ratios.
`ConstrainedGTR` is every other named reversible model of IQ-TREE (K3P, TPM2,
TIM, TVM, ...): a GTR whose six exchangeabilities are tied in classes.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ..data import Alphabet, DNA
from ..runtime import to_device
from ._base import SubstitutionModel

_PAIRS = ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3))  # AC AG AT CG CT GT


def _symmetric(six: Float[Array, " 6"]) -> Float[Array, "4 4"]:
    rows = np.array([i for i, _ in _PAIRS])
    cols = np.array([j for _, j in _PAIRS])
    r = jnp.zeros((4, 4), six.dtype).at[rows, cols].set(six)
    return r + r.T


# IQ-TREE's named reversible DNA models: name -> (rate-class code of AC, AG, AT, CG, CT, GT;
# whether base frequencies are equal by definition). Codes as in IQ-TREE 2's documentation.
NAMED_DNA_MODELS = {
    "JC69": ("000000", True), "F81": ("000000", False),
    "K80": ("010010", True), "HKY85": ("010010", False),
    "TNe": ("010020", True), "TN93": ("010020", False),
    "K3P": ("012210", True), "K3Pu": ("012210", False),
    "TPM2": ("010212", True), "TPM2u": ("010212", False),
    "TPM3": ("012012", True), "TPM3u": ("012012", False),
    "TIMe": ("012230", True), "TIM": ("012230", False),
    "TIM2e": ("010232", True), "TIM2": ("010232", False),
    "TIM3e": ("012032", True), "TIM3": ("012032", False),
    "TVMe": ("012314", True), "TVM": ("012314", False),
    "SYM": ("012345", True), "GTR": ("012345", False),
}


def rate_classes(code: str) -> tuple[int, ...]:
    """The class of each of AC, AG, AT, CG, CT, GT, renumbered as IQ-TREE reads braces.

    Classes are numbered in order of first appearance among AC, AG, AT, CG, CT,
    skipping GT's class, which comes last: e.g. TIM2's "010232" becomes
    (0, 1, 0, 3, 2, 3) and `TIM2{a,b,c}` means AC = AT = a, AG = b, CT = c, CG = GT = 1.
    """
    if len(code) != 6 or not code.isdigit():
        raise ValueError(f"a rate-class code has six digits, not {code!r}")
    order = [c for i, c in enumerate(code[:5]) if c != code[5] and c not in code[:i]]
    index = {c: k for k, c in enumerate(order)}
    index[code[5]] = len(order)
    return tuple(index[c] for c in code)


def _equal_frequencies():
    return to_device(np.full(4, 0.25))


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
        self.kappa = to_device(kappa, float)
        self.frequencies = _equal_frequencies() if frequencies is None else to_device(frequencies)


class F81(SubstitutionModel):
    """Felsenstein (1981): equal exchangeabilities, free frequencies."""

    frequencies: Float[Array, " 4"]
    alphabet: Alphabet = eqx.field(static=True, default=DNA)

    def exchangeabilities(self):
        return jnp.ones((4, 4), self.frequencies.dtype)


class JC69(F81):
    """Jukes & Cantor (1969): F81 with equal frequencies."""

    def __init__(self, frequencies=None):
        self.frequencies = _equal_frequencies() if frequencies is None else to_device(frequencies)


class ConstrainedGTR(SubstitutionModel):
    """A GTR whose six exchangeabilities are tied in classes by a rate-class code.

    `classes[p]` is the class of pair `p` in (AC, AG, AT, CG, CT, GT) and
    `R_ij = class_rates[classes[ij]]`, so with `k` classes the model has
    `k - 1` free exchangeability ratios (only ratios matter: `Q` is
    normalised). Classes follow `rate_classes`: `class_rates[:-1]` are the
    values IQ-TREE reads in braces, in its order, and `class_rates[-1]` is GT's
    class, 1 unless given. E.g. K3P (code 012210) has `R_AG = R_CT = a`,
    `R_AT = R_CG = b`, `R_AC = R_GT = 1`. `name` is the IQ-TREE name (or the code
    itself); equal-frequency variants (K3P, TPM2, TIM2e...) are this class with
    `frequencies` all 1/4.
    """

    class_rates: Float[Array, " classes"]
    frequencies: Float[Array, " 4"]
    name: str = eqx.field(static=True)
    classes: tuple[int, ...] = eqx.field(static=True)
    alphabet: Alphabet = eqx.field(static=True, default=DNA)

    def __init__(self, name: str, class_rates=None, frequencies=None):
        """`name` is one of NAMED_DNA_MODELS or a six-digit code; rates default to 1 and frequencies to 1/4."""
        code = NAMED_DNA_MODELS[name][0] if name in NAMED_DNA_MODELS else name
        self.name = name
        self.classes = rate_classes(code)
        k = max(self.classes) + 1
        self.class_rates = to_device(np.ones(k) if class_rates is None else class_rates, float)
        if self.class_rates.shape != (k,):
            raise ValueError(f"{name} has {k} rate classes, got rates of shape {self.class_rates.shape}")
        self.frequencies = _equal_frequencies() if frequencies is None else to_device(frequencies)

    def six_rates(self) -> Float[Array, " 6"]:
        """The exchangeabilities of AC, AG, AT, CG, CT, GT."""
        return self.class_rates[np.asarray(self.classes)]

    def exchangeabilities(self):
        return _symmetric(self.six_rates())
