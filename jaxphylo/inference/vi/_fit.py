"""Training q by stochastic gradient (optax Adam), blocks of steps on the device, and the estimates from q.

One step draws `K` particles, scores their trees in one batched likelihood
call, and takes an Adam step along VIMCO's estimate of `grad L_K`
(`_objective`): the lengths' network at a rate cosine-decayed from
`learning_rate` to `final_rate` times it, the topology network at
`topology_rate` times that (ARTree's 1e-4 against 1e-3: at equal rates q(tree)
collapsed onto one poor DS1 topology within a thousand steps). `lax.scan` runs a block of steps per device call; the trace
keeps, per step, the annealing `beta`, the `K`-sample bound `L^` and the
particles' mean `log w` (a one-sample ELBO estimate), both at `beta = 1`.

After training, `estimate` draws `repeats x particles` fresh particles (a key
of their own): per repeat the importance-sampling estimate of the marginal
likelihood, `log p^(y) = log mean_i w_i` (unbiased for `p(y)`, so its log is a
stochastic lower bound that tightens with the particles), and the ELBO,
`mean_i log w_i`.
"""

from __future__ import annotations

from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..._errors import InputError
from ._lengths import LengthModel
from ._objective import Target, Variational, draw, multi_sample_bound, vimco_surrogate
from ._topology import TopologyModel


@dataclass(frozen=True)
class VISettings:
    steps: int = 20_000
    particles: int = 10  # K: trees per step (VIMCO needs >= 2)
    learning_rate: float = 1e-3  # Adam's, both networks, at the start: cosine decay to `final_rate` x it at the end
    final_rate: float = 0.05
    topology_rate: float = 0.1  # the topology network's rate as a fraction of the lengths' (ARTree: 1e-4 vs 1e-3)
    anneal: int = 0  # steps over which beta (likelihood's power) rises linearly from `beta_start` to 1; 0: none
    beta_start: float = 0.001
    width: int = 32  # node-feature size of both graph networks
    depth: int = 2  # message-passing rounds
    block: int = 100  # steps per device call (a checkpoint after each)
    branch_rate: float = 10.0  # edge lengths ~ Exponential(rate)
    repeats: int = 10  # importance-sampling estimates of log p(y) (mean and sd reported)
    importance: int = 1000  # particles per estimate
    eval_batch: int = 100  # trees per likelihood call while estimating
    tree_samples: int = 1000  # trees from q written to samples.trees

    def __post_init__(self):
        for name in ("steps", "block", "repeats", "importance", "eval_batch", "tree_samples", "width", "depth"):
            if int(getattr(self, name)) < 1:
                raise InputError(f"vi setting {name} must be at least 1, got {getattr(self, name)}")
        if self.particles < 2:
            raise InputError(f"--particles must be at least 2 (VIMCO's leave-one-out baselines), got {self.particles}")
        if not self.learning_rate > 0 or not self.topology_rate > 0:
            raise InputError(f"learning rates must be positive, got {self.learning_rate}, x{self.topology_rate}")
        if not self.branch_rate > 0:
            raise InputError(f"--branch-rate must be positive, got {self.branch_rate}")
        if self.anneal < 0 or not 0 < self.beta_start <= 1:
            raise InputError(f"annealing needs anneal >= 0 and 0 < beta_start <= 1, got {self.anneal}, "
                             f"{self.beta_start}")

    def optimiser(self):
        """Adam's scaled step; the learning rate is applied by `train_step` (it depends on the run's length,
        which is data to the training program)."""
        return optax.scale_by_adam()

    def learning_rate_at(self, step, steps):
        """Cosine decay from `learning_rate` to `final_rate x learning_rate` over the run's `steps`: large steps
        while q moves, small ones to let q(tree) settle (a constant rate leaves it wandering by several
        hundredths)."""
        cosine = 0.5 * (1.0 + jnp.cos(jnp.pi * jnp.minimum(step / steps, 1.0)))
        return self.learning_rate * (self.final_rate + (1.0 - self.final_rate) * cosine)


class FitState(eqx.Module):
    q: Variational
    opt_state: object
    key: jax.Array
    step: jax.Array  # [] steps done


def initial_fit_state(num_tips: int, settings: VISettings, seed: int) -> FitState:
    k_top, k_len, key = jax.random.split(jax.random.PRNGKey(seed), 3)
    q = Variational(TopologyModel(num_tips, settings.width, settings.depth, key=k_top),
                    LengthModel(num_tips, settings.width, settings.depth, key=k_len))
    opt_state = settings.optimiser().init(eqx.filter(q, eqx.is_inexact_array))
    return FitState(q, opt_state, key, jnp.zeros((), jnp.int32))


def beta_at(step, settings: VISettings, anneal):
    """The likelihood's power at `step`: linear from `beta_start` to 1 over `anneal` steps (traced), then 1."""
    rising = settings.beta_start + (1.0 - settings.beta_start) * step / jnp.maximum(anneal, 1)
    return jnp.where(anneal > 0, jnp.minimum(1.0, rising), 1.0)


def train_step(state: FitState, target: Target, settings: VISettings, steps, anneal) -> tuple[FitState, jax.Array]:
    """One Adam step along VIMCO's gradient; the trace row `(beta, L^, mean log w)`."""
    key, k_draw = jax.random.split(state.key)
    beta = beta_at(state.step, settings, anneal)

    def loss(q):
        particles = draw(q, target, k_draw, settings.particles)
        surrogate = vimco_surrogate(particles.log_weights(beta), particles.log_q_tree)
        log_w = jax.lax.stop_gradient(particles.log_weights())
        return -surrogate, jnp.stack([beta, multi_sample_bound(log_w), jnp.mean(log_w)])

    grads, row = eqx.filter_grad(loss, has_aux=True)(state.q)
    params = eqx.filter(state.q, eqx.is_inexact_array)
    updates, opt_state = settings.optimiser().update(grads, state.opt_state, params)
    rate = settings.learning_rate_at(state.step, steps)
    updates = jax.tree.map(lambda u: -rate * u, updates)  # ascent on the bound: descent on -surrogate
    updates = eqx.tree_at(lambda u: u.topology, updates,
                          jax.tree.map(lambda u: settings.topology_rate * u, updates.topology))
    return FitState(eqx.apply_updates(state.q, updates), opt_state, key, state.step + 1), row


@eqx.filter_jit
def run_block(state: FitState, target: Target, settings: VISettings, count, steps, anneal):
    """`count` (<= `settings.block`) steps of a run of `steps` annealed over `anneal` (all traced: one program for
    every length);
    trace rows `[block, 3]` (rows past `count` are NaN)."""
    dynamic, static = eqx.partition(state, eqx.is_array)

    def one(dynamic, i):
        def advance(d):
            new, row = train_step(eqx.combine(d, static), target, settings, steps, anneal)
            return eqx.filter(new, eqx.is_array), row

        def hold(d):
            return d, jnp.full(3, jnp.nan)

        return jax.lax.cond(i < count, advance, hold, dynamic)

    dynamic, rows = jax.lax.scan(one, dynamic, jnp.arange(settings.block))
    return eqx.combine(dynamic, static), rows


@eqx.filter_jit
def _draw_weights(q: Variational, target: Target, key, count: int):
    particles = draw(q, target, key, count)
    return particles.log_weights(), particles.parents, particles.lengths


def estimate(q: Variational, target: Target, settings: VISettings, key):
    """Per repeat the importance-sampled `log p(y)` and the ELBO; all particles' trees and `log w`.

    Returns `(log_ml [repeats], elbo [repeats], parents [R * n, M], lengths [R * n, M], log_w [R * n])`.
    """
    batches = -(-settings.importance // settings.eval_batch)
    log_ml, elbo, parents, lengths, weights = [], [], [], [], []
    for r in range(settings.repeats):
        chunks = [_draw_weights(q, target, k, settings.eval_batch)
                  for k in jax.random.split(jax.random.fold_in(key, r), batches)]
        log_w = np.concatenate([np.asarray(c[0]) for c in chunks])[:settings.importance]
        parents.append(np.concatenate([np.asarray(c[1]) for c in chunks])[:settings.importance])
        lengths.append(np.concatenate([np.asarray(c[2]) for c in chunks])[:settings.importance])
        weights.append(log_w)
        log_ml.append(float(multi_sample_bound(jnp.asarray(log_w))))
        elbo.append(float(np.mean(log_w)))
    return (np.asarray(log_ml), np.asarray(elbo), np.concatenate(parents), np.concatenate(lengths),
            np.concatenate(weights))
