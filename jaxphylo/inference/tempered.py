"""Metropolis coupling: any kernel of `base.py` run at a ladder of heats, with heats swapped between chains.

`runs x chains` chains (run-major) each hold a heat index; chain `i` runs the kernel at inverse temperature
`beta[heat_i]`, `beta_k = 1 / (1 + lambda k)` (MrBayes's incremental heating; heat 0 is the cold chain).
After every generation, in every run, two random chains `i`, `j` propose to exchange heats, accepted with
probability `min(1, exp((beta_i - beta_j)(P_j - P_i)))`, `P` the log posterior (prior and likelihood heated
together), drawn from the run's own stream (so that runs split over devices draw what they draw on one). Heats move, states do not (MrBayes's rule): nothing a chain keeps, its likelihood's partials
included, moves between chains.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from .base import MCMCState, chain_keys


class TemperedState(eqx.Module):
    chains: MCMCState  # `[runs x chains]` leading
    heat: Int[Array, " B"]  # each chain's heat index within its run; 0 is the cold chain
    swaps_tried: Int[Array, "runs chains chains"]  # by (lower, higher) heat index
    swaps_accepted: Int[Array, "runs chains chains"]


def heats(chains: int, temperature: float) -> Float[Array, " chains"]:
    """`beta_k = 1 / (1 + temperature k)`."""
    return 1.0 / (1.0 + temperature * jnp.arange(chains))


def init(chains: MCMCState, runs: int, per_run: int) -> TemperedState:
    swaps = jnp.zeros((runs, per_run, per_run), jnp.int32)
    return TemperedState(chains, jnp.tile(jnp.arange(per_run), runs), swaps, swaps)


def in_heat_order(state: TemperedState, chains: int):
    """`pick(x)`: a leaf `[runs x chains, ...]` of the chains as `[runs, chains, ...]`, column `k` the chain at heat
    `k` (column 0 the cold chain)."""
    order = jnp.argsort(state.heat.reshape(-1, chains), axis=1)

    def pick(x):
        shaped = x.reshape((-1, chains) + x.shape[1:])
        return jnp.take_along_axis(shaped, order.reshape(order.shape + (1,) * (x.ndim - 1)), axis=1)

    return pick


def cold(state: TemperedState, chains: int):
    """`pick(x)`: the cold chain's row of a leaf `[runs x chains, ...]`, `[runs, ...]`."""
    ordered = in_heat_order(state, chains)
    return lambda x: ordered(x)[:, 0]


def tempered(step, chains: int, temperature: float):
    """`step(key, state, beta)` of every chain at its heat, then one heat swap per run: `(key, state) -> (state,
    info)` over a `TemperedState`."""
    beta = heats(chains, temperature)

    def tempered_step(key, state: TemperedState):
        k_step, k_swap = jax.random.split(key)
        inner, info = step(k_step, state.chains, beta[state.heat])
        state = eqx.tree_at(lambda s: s.chains, state, inner)
        return (_swap_heats(k_swap, state, beta, chains) if chains > 1 else state), info

    return tempered_step


def _swap_heats(key, state: TemperedState, beta, chains: int) -> TemperedState:
    log_post = (state.chains.log_likelihood + state.chains.log_prior).reshape(-1, chains)
    run_keys = chain_keys(key, state.chains.chain.reshape(-1, chains)[:, 0] // chains)  # numbered by run

    def one_run(heat, log_post, tried, accepted, key):
        # Per run under vmap, so that runs split over devices stay split (see `runtime.take_per_tree`).
        k1, k2, k3 = jax.random.split(key, 3)
        i = jax.random.randint(k1, (), 0, chains)
        j = (i + 1 + jax.random.randint(k2, (), 0, chains - 1)) % chains
        draw = jax.random.uniform(k3)
        hi, hj = heat[i], heat[j]
        accept = jnp.log(draw) < (beta[hi] - beta[hj]) * (log_post[j] - log_post[i])
        heat = heat.at[i].set(jnp.where(accept, hj, hi)).at[j].set(jnp.where(accept, hi, hj))
        low, high = jnp.minimum(hi, hj), jnp.maximum(hi, hj)
        return heat, tried.at[low, high].add(1), accepted.at[low, high].add(accept.astype(jnp.int32))

    heat, tried, accepted = jax.vmap(one_run)(state.heat.reshape(-1, chains), log_post, state.swaps_tried,
                                              state.swaps_accepted, run_keys)
    return TemperedState(state.chains, heat.reshape(-1), tried, accepted)
