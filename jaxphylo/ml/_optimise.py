"""One optimiser loop for every maximum-likelihood fit: optax steps inside a `lax.while_loop`.

Convergence: the objective (minus log L) improved by less than `tolerance`
over the last `WINDOW` iterations, or `max_iterations` were taken. A window
rather than one step: L-BFGS sometimes takes a tiny step before a large one.
"""

from __future__ import annotations

from functools import partial

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

WINDOW = 5
OPTIMIZERS = ("lbfgs", "adam")


def make_optimizer(name: str, learning_rate: float = 0.05) -> optax.GradientTransformationExtraArgs:
    """L-BFGS with a zoom line search (the default), or Adam."""
    if name == "lbfgs":
        return optax.lbfgs(memory_size=20)
    if name == "adam":
        return optax.adam(learning_rate)
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}, not {name!r}")


def minimise(objective, params, args, optimizer_name: str, tolerance, max_iterations):
    """Minimise `objective(params, *args)`; returns `(params, value, iterations)`.

    `args` are traced (data and templates are arguments, not constants: closing
    over them would make XLA constant-fold the kernels at compile time), and so
    are `tolerance` and `max_iterations`: a search fits the model with 1e-3 at
    its start and 1e-4 at its end, and as static numbers they made two copies of
    its largest program (a partitioned DS1 search on an H200 loaded each in 6.9 s
    from a warm cache, `startup-partitioned-h200-gpu.json`).
    """
    return _minimise(objective, params, args, optimizer_name, jnp.asarray(tolerance, jnp.float64),
                     jnp.asarray(max_iterations, jnp.int32))


@partial(eqx.filter_jit, donate="none")
def _minimise(objective, params, args, optimizer_name: str, tolerance, max_iterations):
    optimizer = make_optimizer(optimizer_name)
    f = lambda p: objective(p, *args)
    value_and_grad = optax.value_and_grad_from_state(f) if optimizer_name == "lbfgs" else jax.value_and_grad(f)

    def step(carry):
        params, state, history, k = carry
        if optimizer_name == "lbfgs":
            value, grad = value_and_grad(params, state=state)
            updates, state = optimizer.update(grad, state, params, value=value, grad=grad, value_fn=f)
        else:
            value, grad = value_and_grad(params)
            updates, state = optimizer.update(grad, state, params)
        params = optax.apply_updates(params, updates)
        return params, state, jnp.roll(history, 1).at[0].set(value), k + 1

    def going(carry):
        _, _, history, k = carry
        stalled = (k > WINDOW) & (history[WINDOW] - history[0] < tolerance)
        return (k < max_iterations) & ~stalled

    history = jnp.full(WINDOW + 1, jnp.inf)
    params, _, _, k = jax.lax.while_loop(going, step, (params, optimizer.init(params), history, 0))
    return params, f(params), k
