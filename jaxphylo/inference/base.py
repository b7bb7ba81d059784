"""What every Metropolis–Hastings sampler here shares: a batch of chains, a weighted mixture of moves, one
accept rule and one tuning rule.

A generation of a batch of `B` chains draws each chain's move from the weights of the local moves (a
categorical draw per chain), or, with probability `w_hmc / sum(w)` (one draw for all chains, so that the
gradient program runs for all or none), an HMC move of every chain (`mixture`). The proposal with
log proposal ratio `log q` is accepted with probability `min(1, exp(beta dlog posterior + log q))`
(`metropolis_hastings`); a chain whose proposed posterior is not finite keeps its state. While tuning,
the tuning of the move used (a multiplier's lambda, a window, an HMC step size) takes a Robbins–Monro step
on its log towards the move's target acceptance: `log s += (accepted - target) / sqrt(1 + g / 100)`
(`robbins_monro`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from .._errors import InputError


def check_moves(moves: tuple, known: tuple) -> None:
    """`(name, weight)` pairs: known names, weights non-negative and not all zero."""
    if unknown := sorted(set(dict(moves)) - set(known)):
        raise InputError(f"unknown move {unknown[0]!r}: moves are {', '.join(known)}")
    if any(w < 0 for _, w in moves) or sum(w for _, w in moves) <= 0:
        raise InputError("move weights must be non-negative and not all zero")


def where(mask: Bool[Array, " B"], new, old):
    """`new` where the per-chain `mask` holds, else `old` (pytrees whose leaves are `[B, ...]`)."""
    return jax.tree.map(lambda n, o: jnp.where(mask.reshape((-1,) + (1,) * (n.ndim - 1)), n, o), new, old)


def uniform_choice(key, mask: Bool[Array, " n"]) -> Int[Array, ""]:
    """A uniformly random index where `mask` holds (argmax of masked uniforms)."""
    return jnp.argmax(jnp.where(mask, jax.random.uniform(key, mask.shape), -1.0)).astype(jnp.int32)


def draw_moves(key_kind, key_pick, weights: Float[Array, " moves"], hmc: int, chains: int):
    """Each chain's local move (`[B]` indices into `weights[:hmc]`), and whether this generation is HMC's."""
    kind = jax.random.categorical(key_kind, jnp.log(weights[:hmc]), shape=(chains,))
    use_hmc = jax.random.uniform(key_pick) * jnp.sum(weights) < weights[hmc]
    return kind, use_hmc


def mixture(use_hmc, hmc_enabled: bool, hamiltonian, local):
    """`hamiltonian(None)` or `local(None)` as `use_hmc` says; with HMC's weight zero (static) the gradient
    program is not even built."""
    if hmc_enabled:
        return jax.lax.cond(use_hmc, hamiltonian, local, None)
    return local(None)


def metropolis_hastings(key, log_ratio: Float[Array, " B"], log_posterior: Float[Array, " B"]) -> Bool[Array, " B"]:
    """Each chain's accept decision: `log u < log_ratio`, and never a non-finite proposed posterior."""
    return (jnp.log(jax.random.uniform(key, log_ratio.shape)) < log_ratio) & jnp.isfinite(log_posterior)


def tally(proposed, accepted, kind: Int[Array, " B"], accept: Bool[Array, " B"]):
    """Per-chain counts of proposals and acceptances by move (`[B, moves]` each)."""
    chosen = jax.nn.one_hot(kind, proposed.shape[1], dtype=proposed.dtype)
    return proposed + chosen, accepted + chosen * accept[:, None]


def robbins_monro(tunings: Float[Array, "B T"], column: Int[Array, " B"], accept: Bool[Array, " B"], target,
                  generation, tune_generations: int, bounds: tuple[float, float]) -> Float[Array, "B T"]:
    """One Robbins–Monro step on the log of each chain's tuning `column` (-1: none) towards `target` while
    `generation < tune_generations`; tunings stay within `bounds`."""
    tunable = (column >= 0) & (generation < tune_generations)
    step = (accept.astype(tunings.dtype) - target) / jnp.sqrt(1.0 + generation / 100.0)
    change = jax.nn.one_hot(jnp.maximum(column, 0), tunings.shape[1]) * jnp.where(tunable, step, 0.0)[:, None]
    return jnp.clip(tunings * jnp.exp(change), *bounds)
