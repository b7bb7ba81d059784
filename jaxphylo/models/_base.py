"""Reversible substitution models and their transition matrices.

A reversible model is a symmetric exchangeability matrix `R` and stationary
frequencies `pi`: `Q_ij = R_ij pi_j` (i != j), rows summing to zero, scaled so
that the expected rate `-sum_i pi_i Q_ii` is one substitution per unit branch
length. Then `A = diag(pi)^1/2 Q diag(pi)^-1/2` is symmetric, `A = U diag(lam) U^T`,
and `P(t) = diag(pi)^-1/2 U diag(exp(lam t)) U^T diag(pi)^1/2`.
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from ..runtime import product_precision


class SubstitutionModel(eqx.Module):
    """A reversible continuous-time Markov chain over an alphabet's states.

    Subclasses have fields `frequencies` (a float leaf, `[states]`) and
    `alphabet` (static), and define `exchangeabilities`.
    """

    @abc.abstractmethod
    def exchangeabilities(self) -> Float[Array, "states states"]:
        """Symmetric `R` with a zero diagonal (only the off-diagonal is used)."""

    def rate_matrix(self) -> Float[Array, "states states"]:
        """`Q`, normalised to one expected substitution per unit time."""
        pi = self.frequencies
        offdiag = _off_diagonal(self.exchangeabilities()) * pi[None, :]
        q = offdiag - jnp.diag(offdiag.sum(axis=1))
        return q / jnp.sum(pi * offdiag.sum(axis=1))

    def symmetric_form(self) -> tuple[Float[Array, "states states"], Float[Array, " states"]]:
        """`(A, sqrt(pi))` with `A = diag(pi)^1/2 Q diag(pi)^-1/2` symmetric."""
        pi = self.frequencies
        r = _off_diagonal(self.exchangeabilities())
        scale = jnp.sum(pi * jnp.matmul(r, pi, precision=product_precision()))
        root = jnp.sqrt(pi)
        sym = r * root[:, None] * root[None, :] / scale
        return sym - jnp.diag(jnp.matmul(r, pi, precision=product_precision()) / scale), root

    def transitions(self, times: Float[Array, "*batch"]) -> Float[Array, "*batch states states"]:
        """`P(t) = expm(t Q)` for every `t` in `times`."""
        sym, root = self.symmetric_form()
        return _unsymmetrised(symmetric_exponentials(sym, times), root)


class Decomposed(SubstitutionModel):
    """A substitution model at fixed parameters, its eigensystem `A = U diag(lam) U^T` computed once.

    A sampler or a likelihood evaluated many times under a model that does not move (JC69, or every
    parameter in braces) then pays for `P(t) = diag(pi)^-1/2 U diag(exp(lam t)) U^T diag(pi)^1/2` alone, not
    for an eigendecomposition per call. No gradient reaches the model's parameters through it; one reaches `t`.
    """

    frequencies: Float[Array, " states"]
    eigenvalues: Float[Array, " states"]
    eigenvectors: Float[Array, "states states"]
    alphabet: object = eqx.field(static=True)

    def rate_matrix(self) -> Float[Array, "states states"]:
        return _unsymmetrised(_rotated(self.eigenvectors, self.eigenvalues), jnp.sqrt(self.frequencies))

    def exchangeabilities(self) -> Float[Array, "states states"]:
        """`R_ij = Q_ij / pi_j` off the diagonal (at the normalised scale)."""
        return _off_diagonal(self.rate_matrix() / self.frequencies[None, :])

    def transitions(self, times: Float[Array, "*batch"]) -> Float[Array, "*batch states states"]:
        exponentials = _rotated(self.eigenvectors, jnp.exp(self.eigenvalues * times[..., None]))
        return _unsymmetrised(exponentials, jnp.sqrt(self.frequencies))


def decomposed(substitution: SubstitutionModel) -> Decomposed:
    """`substitution` with its eigensystem computed now (`Decomposed`)."""
    sym, _ = substitution.symmetric_form()
    lam, u = _eigh(sym)
    return Decomposed(substitution.frequencies, lam, u, substitution.alphabet)


def _rotated(u, diagonal: Float[Array, "*batch states"]) -> Float[Array, "*batch states states"]:
    """`U diag(d) U^T` for every row `d` of `diagonal`."""
    return jnp.einsum("ik,...k,jk->...ij", u, diagonal, u, precision=product_precision())


def _unsymmetrised(m, root):
    """`diag(pi)^-1/2 M diag(pi)^1/2` (`root = sqrt(pi)`): from the symmetric form back to `Q`'s basis."""
    return m * (root[None, :] / root[:, None])


def _off_diagonal(m):
    return m * (1.0 - jnp.eye(m.shape[-1], dtype=m.dtype))


def _eigh(sym):
    # Symmetrise explicitly: round-off asymmetry would otherwise leak into the gradient.
    return jnp.linalg.eigh(0.5 * (sym + sym.T))


def _exprel(x):
    """`(exp(x) - 1) / x` for x <= 0, smooth through zero."""
    small = jnp.abs(x) < 1e-6
    safe = jnp.where(small, -1.0, x)
    return jnp.where(small, 1.0 + x / 2 + x * x / 6, jnp.expm1(safe) / safe)


@jax.custom_jvp
def symmetric_exponentials(
    sym: Float[Array, "S S"], times: Float[Array, "*batch"]
) -> Float[Array, "*batch S S"]:
    """`expm(t A) = U diag(exp(lam t)) U^T` for symmetric `A` and every `t` in `times`.

    The derivative is Daleckii-Krein's: `d expm(tA)[dA] = U (F o (U^T dA U)) U^T`
    with divided differences `F_ij = (exp(t lam_i) - exp(t lam_j)) / (lam_i - lam_j)`
    (`t exp(t lam_i)` when they coincide). Differentiating `eigh` instead divides by
    `lam_i - lam_j` and gives NaN for JC69, K80, F81 and equal-frequency models.
    """
    lam, u = _eigh(sym)
    return _rotated(u, jnp.exp(lam * times[..., None]))


@symmetric_exponentials.defjvp
def _symmetric_exponentials_jvp(primals, tangents):
    sym, times = primals
    d_sym, d_times = tangents
    lam, u = _eigh(sym)
    t = times[..., None, None]
    high = jnp.maximum(lam[:, None], lam[None, :])  # factor out the larger exponent: no overflow
    low = jnp.minimum(lam[:, None], lam[None, :])
    divided = t * jnp.exp(t * high) * _exprel(t * (low - high))
    rotated = jnp.einsum("ki,kl,lj->ij", u, 0.5 * (d_sym + d_sym.T), u, precision=product_precision())
    decay = jnp.exp(lam * times[..., None])
    d_out = jnp.einsum("ik,...kl,jl->...ij", u, divided * rotated, u, precision=product_precision())
    d_out += _rotated(u, lam * decay * d_times[..., None])
    return _rotated(u, decay), d_out


def transition_matrices(
    substitution: SubstitutionModel, times: Float[Array, " branches"], rates: Float[Array, " categories"]
) -> Float[Array, "branches categories states states"]:
    """`P[b, c] = expm(rates[c] * times[b] * Q) = diag(pi)^-1/2 expm(rates[c] times[b] A) diag(pi)^1/2`."""
    return substitution.transitions(times[:, None] * rates[None, :])
