"""Training q by stochastic gradient (optax Adam), blocks of steps on the device, and the estimates from q.

One step draws `K` particles (trees from q, or with `explore` from q with a
share of uniform insertion), scores their trees in one batched likelihood call,
and takes an Adam step along the multi-sample bound's gradient, q(tree)'s part
by VIMCO or, on exploring particles, by reweighted wake-sleep (`_objective`):
the lengths' network at a rate cosine-decayed from `learning_rate` to
`final_rate` times it, the topology network at `topology_rate` times that.
Every member of a population (`initial_fit_state`'s leading axis) takes its
step in one vmapped program. `lax.scan` runs a block of steps per device call;
the trace keeps, per step, the annealing `beta`, the `K`-sample bound `L^` and
the particles' mean `log w` (a one-sample ELBO estimate), both at `beta = 1`.

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
from ._objective import Target, Variational, draw, multi_sample_bound, rws_surrogate, vimco_surrogate
from ._graph import tip_coordinates
from ._topology import TopologyModel


@dataclass(frozen=True)
class VISettings:
    steps: int = 20_000
    particles: int = 10  # K: trees per step (VIMCO needs >= 2)
    learning_rate: float = 1e-2  # Adam's, both networks, at the start: cosine decay to `final_rate` x it at the end
    final_rate: float = 0.05
    topology_rate: float = 0.3  # the topology network's rate as a fraction of the lengths' (ARTree: 1e-4 vs 1e-3)
    anneal: int = 0  # steps over which beta (likelihood's power) rises linearly from `beta_start` to 1; 0: none
    beta_start: float = 0.001
    width: int = 32  # node-feature size of both graph networks
    depth: int = 2  # message-passing rounds
    proximity: float = 10.0  # the topology's starting weight on distance-guided insertion (`TopologyModel`)
    explore: float = 0.05  # > 0: trees drawn with this share of uniform insertion, falling to 0 at half the run,
    # and q(tree) trained by reweighted wake-sleep (`rws_surrogate`); 0: VIMCO on trees from q
    population: int | None = None  # q's trained side by side (None: 8 on a GPU, 1 on a CPU), the best at the end
    # kept; the worse half replaced by copies of the better at each of `selections`
    selections: int = 0  # selections, one every tenth of the run from the first; 0: independent restarts
    block: int = 100  # steps per device call (a checkpoint after each)
    branch_rate: float = 10.0  # edge lengths ~ Exponential(rate)
    repeats: int = 10  # importance-sampling estimates of log p(y) (mean and sd reported)
    importance: int = 1000  # particles per estimate
    eval_batch: int = 100  # trees per likelihood call while estimating
    tree_samples: int = 1000  # trees from q written to samples.trees

    def __post_init__(self):
        if self.population is None:  # the GPU's width costs little: a step is launch-bound, not arithmetic-bound
            object.__setattr__(self, "population", 8 if jax.default_backend() == "gpu" else 1)
        for name in ("steps", "block", "repeats", "importance", "eval_batch", "tree_samples", "width", "depth",
                     "population"):
            if int(getattr(self, name)) < 1:
                raise InputError(f"vi setting {name} must be at least 1, got {getattr(self, name)}")
        if self.particles < 2:
            raise InputError(f"--particles must be at least 2 (VIMCO's leave-one-out baselines), got {self.particles}")
        if not self.learning_rate > 0 or not self.topology_rate > 0:
            raise InputError(f"learning rates must be positive, got {self.learning_rate}, x{self.topology_rate}")
        if not self.branch_rate > 0:
            raise InputError(f"--branch-rate must be positive, got {self.branch_rate}")
        if not 0 <= self.explore < 1:
            raise InputError(f"--explore is a share of uniform insertion, in [0, 1), not {self.explore}")
        if not 0 <= self.selections <= 10:
            raise InputError(f"selections happen at tenths of the run: 0 to 10 of them, not {self.selections}")
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


def initial_fit_state(num_tips: int, settings: VISettings, seed: int, distances=None) -> FitState:
    """The untrained population: `settings.population` independent q's (leading axis), random networks with tip
    embeddings from `distances [N, N]` (`tip_coordinates`) when given, and then the topology's proximity weight
    `settings.proximity`."""

    scaled = None if distances is None else tip_coordinates(distances, settings.width)  # once for every member

    def member(key):
        k_top, k_len, k_tips, key = jax.random.split(key, 4)
        tips = None if scaled is None else scaled + 0.1 * np.asarray(jax.random.normal(k_tips, scaled.shape))
        q = Variational(TopologyModel(num_tips, settings.width, settings.depth, key=k_top, tips=tips,
                                      proximity=0.0 if tips is None else settings.proximity),
                        LengthModel(num_tips, settings.width, settings.depth, key=k_len, tips=tips))
        opt_state = settings.optimiser().init(eqx.filter(q, eqx.is_inexact_array))
        return FitState(q, opt_state, key, jnp.zeros((), jnp.int32))

    members = [member(k) for k in jax.random.split(jax.random.PRNGKey(seed), settings.population)]
    static = eqx.partition(members[0], eqx.is_array)[1]
    arrays = [eqx.filter(m, eqx.is_array) for m in members]
    return eqx.combine(jax.tree.map(lambda *xs: jnp.stack(xs), *arrays), static)


def select(state: FitState, scores) -> tuple[FitState, np.ndarray]:
    """The population after a selection: the members of the worse half (by `scores [P]`, higher better) replaced by
    copies of the better half (networks and Adam's moments), each keeping its own random key so that copies part.
    Returns the state and `source [P]`, the member each slot now holds."""
    order = np.argsort(-np.asarray(scores), kind="stable")
    keep = (len(order) + 1) // 2
    source = np.arange(len(order))
    source[order[keep:]] = order[:len(order) - keep]
    copied = _map_arrays(lambda x: x[source], state)
    return eqx.tree_at(lambda s: s.key, copied, state.key), source


def member(state: FitState, index: int) -> FitState:
    """One member of a population."""
    return _map_arrays(lambda x: x[index], state)


def _map_arrays(f, tree):
    arrays, static = eqx.partition(tree, eqx.is_array)
    return eqx.combine(jax.tree.map(f, arrays), static)


def beta_at(step, settings: VISettings, anneal):
    """The likelihood's power at `step`: linear from `beta_start` to 1 over `anneal` steps (traced), then 1."""
    rising = settings.beta_start + (1.0 - settings.beta_start) * step / jnp.maximum(anneal, 1)
    return jnp.where(anneal > 0, jnp.minimum(1.0, rising), 1.0)


def explore_at(step, settings: VISettings, steps):
    """The share of uniform insertion at `step`: `settings.explore`, falling linearly to 0 at half the run."""
    return settings.explore * jnp.maximum(0.0, 1.0 - 2.0 * step / steps)


def train_step(state: FitState, target: Target, settings: VISettings, steps, anneal) -> tuple[FitState, jax.Array]:
    """One Adam step along VIMCO's gradient (reweighted wake-sleep's for q(tree) when `settings.explore`); the
    trace row `(beta, L^, mean log w)` (while exploring, of the exploring proposal's particles)."""
    key, k_draw = jax.random.split(state.key)
    beta = beta_at(state.step, settings, anneal)

    def loss(q):
        if settings.explore > 0:
            particles = draw(q, target, k_draw, settings.particles, explore_at(state.step, settings, steps))
            held = eqx.tree_at(lambda p: p.log_r_tree, particles, jax.lax.stop_gradient(particles.log_r_tree))
            surrogate = rws_surrogate(held.log_weights(beta), particles.log_q_tree)
        else:
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
    """`count` (<= `settings.block`) steps of every member of a population (`state`'s leading axis) in a run of
    `steps` annealed over `anneal` (all traced: one program for every length); trace rows `[P, block, 3]` (rows
    past `count` are NaN)."""
    return eqx.filter_vmap(_member_block, in_axes=(eqx.if_array(0), None, None, None, None, None))(
        state, target, settings, count, steps, anneal)


def _member_block(state: FitState, target: Target, settings: VISettings, count, steps, anneal):
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
