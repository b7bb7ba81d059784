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
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._alphabet import Alphabet


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

    def eigensystem(self):
        """(eigenvalues [S], left [S, S], right [S, S]) with `P(t) = left diag(exp(lam t)) right`."""
        pi = self.frequencies
        r = _off_diagonal(self.exchangeabilities())
        scale = jnp.sum(pi * (r @ pi))
        root = jnp.sqrt(pi)
        sym = r * root[:, None] * root[None, :] / scale
        sym = sym - jnp.diag((r @ pi) / scale)
        lam, u = symmetric_eigh(sym)
        return lam, u / root[:, None], (u * root[:, None]).T


def _off_diagonal(m):
    return m * (1.0 - jnp.eye(m.shape[-1], dtype=m.dtype))


def symmetric_eigh(sym):
    # Symmetrise explicitly: round-off asymmetry would otherwise leak into the gradient.
    return jnp.linalg.eigh(0.5 * (sym + sym.T))


def transition_matrices(
    eigensystem, times: Float[Array, " branches"], rates: Float[Array, " categories"]
) -> Float[Array, "branches categories states states"]:
    """`P[b, c] = expm(rates[c] * times[b] * Q)` for every branch and category at once."""
    lam, left, right = eigensystem
    decay = jnp.exp(lam[None, None, :] * (times[:, None, None] * rates[None, :, None]))
    return jnp.einsum("ik,bck,kj->bcij", left, decay, right)
