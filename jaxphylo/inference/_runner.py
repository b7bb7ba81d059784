"""Running NUTS in blocks that are saved as they finish, so an interrupted run loses nothing.

A run directory holds `run.json` (what was asked: compared on resume),
`checkpoint.pkl` (the sampler's state after the last saved block, written
after the block itself, atomically) and `blocks/block_NNNNN.npz`. Warmup
counts as block zero: its adapted step size and mass matrix are in the first
checkpoint, so a resumed run never warms up again.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from numpyro import handlers
from numpyro.distributions import Unit
from numpyro.infer import MCMC, NUTS, init_to_value

from .._errors import InputError

EXTRA_FIELDS = ("diverging", "num_steps", "accept_prob")


@dataclass
class Draws:
    """All saved draws: `samples[name]` and `stats[name]` shaped `[chains, draws, ...]`."""

    samples: dict
    stats: dict

    @property
    def num_draws(self) -> int:
        return next(iter(self.stats.values())).shape[1] if self.stats else 0


def chain_method(chains: int) -> str:
    """`vectorized` on an accelerator, `parallel` when there is a CPU device per chain, else `sequential`."""
    if jax.default_backend() != "cpu":
        return "vectorized"
    return "parallel" if jax.local_device_count() >= chains > 1 else "sequential"


def _atomic_write(path: Path, write) -> None:
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def _check_run_directory(out: Path, settings: dict, resume: bool) -> int:
    """Blocks already done (0 for a new run); a clear error when `out` holds something else."""
    record = out / "run.json"
    if not record.exists():
        if resume and out.exists() and any(out.iterdir()):
            raise InputError(f"{out}: nothing to resume (no run.json)")
        out.mkdir(parents=True, exist_ok=True)
        (out / "blocks").mkdir(exist_ok=True)
        record.write_text(json.dumps(settings, indent=2, sort_keys=True))
        return 0
    if not resume:
        raise InputError(f"{out} already holds a run; continue it with --resume or choose another --out")
    saved = json.loads(record.read_text())
    for key in sorted(set(saved) | set(settings)):
        if key != "samples" and saved.get(key) != settings.get(key):
            raise InputError(f"{out} holds a different analysis: {key} was {saved.get(key)!r} there, "
                             f"{settings.get(key)!r} now")
    if saved.get("samples") != settings.get("samples"):
        record.write_text(json.dumps(settings, indent=2, sort_keys=True))
    checkpoint = out / "checkpoint.pkl"
    return pickle.loads(checkpoint.read_bytes())["blocks"] if checkpoint.exists() else 0


def run_nuts(model, data, init: dict, out, *, settings: dict, chains: int = 4, warmup: int = 500,
             samples: int = 1000, block: int = 100, seed: int = 0, resume: bool = False,
             progress: bool = True, method: str | None = None, log=print) -> Draws:
    """NUTS on `model(data)`, `chains` chains, saved in blocks of `block` draws under `out`.

    `settings` describes the run (data, analysis, sampler options); a resumed
    run must match it except for `samples`, which may grow.
    """
    out = Path(out)
    settings = json.loads(json.dumps(dict(settings, chains=chains, warmup=warmup, block=block, seed=seed,
                                          samples=samples)))  # as it will read back (tuples become lists)
    done = _check_run_directory(out, settings, resume)
    total = -(-samples // block)
    kernel = NUTS(model, init_strategy=init_to_value(values=init))
    mcmc = MCMC(kernel, num_warmup=warmup, num_samples=block, num_chains=chains,
                chain_method=method or chain_method(chains), progress_bar=progress)
    checkpoint = out / "checkpoint.pkl"
    if checkpoint.exists():
        mcmc.post_warmup_state = pickle.loads(checkpoint.read_bytes())["state"]
        log(f"# resuming {out}: {done} of {total} blocks done")
    else:
        log(f"# warmup: {chains} chains x {warmup} iterations ({mcmc.chain_method})")
        mcmc.warmup(jax.random.PRNGKey(seed), data, collect_warmup=False)
        _save_state(checkpoint, mcmc.post_warmup_state, 0)
    for index in range(done, total):
        mcmc.run(mcmc.post_warmup_state.rng_key, data, extra_fields=EXTRA_FIELDS)
        draws = {k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()}
        stats = {k: np.asarray(v) for k, v in mcmc.get_extra_fields(group_by_chain=True).items()}
        stats.update(_log_densities(model, data, draws))
        _atomic_write(out / "blocks" / f"block_{index:05d}.npz",
                      lambda h: np.savez(h, **{f"sample:{k}": v for k, v in draws.items()},
                                         **{f"stat:{k}": v for k, v in stats.items()}))
        mcmc.post_warmup_state = mcmc.last_state
        _save_state(checkpoint, mcmc.last_state, index + 1)
        log(f"# block {index + 1}/{total} saved: {block} draws x {chains} chains, "
            f"{int(stats['diverging'].sum())} divergent")
    return load_draws(out, total)


def _save_state(path: Path, state, blocks: int) -> None:
    host = jax.device_get(state)
    _atomic_write(path, lambda h: pickle.dump({"blocks": blocks, "state": host}, h))


def _log_densities(model, data, draws: dict) -> dict:
    """Log posterior (constrained space), log-likelihood and log prior of every draw, in one model pass."""
    chains, num = next(iter(draws.values())).shape[:2]
    flat = {k: v.reshape((chains * num,) + v.shape[2:]) for k, v in draws.items()}

    def split(draw):
        trace = handlers.trace(handlers.substitute(model, draw)).get_trace(data)
        likelihood = prior = 0.0
        for site in trace.values():
            if site["type"] != "sample":
                continue
            term = jnp.sum(site["fn"].log_prob(site["value"]))
            factor = isinstance(site["fn"], Unit)  # numpyro.factor: our 1/x priors
            if site["is_observed"] and not factor:
                likelihood = likelihood + term
            else:
                prior = prior + term
        return likelihood, prior

    likelihood, prior = jax.vmap(split)(flat)
    shaped = lambda x: np.asarray(x).reshape(chains, num)
    return {"posterior": shaped(likelihood + prior), "likelihood": shaped(likelihood), "prior": shaped(prior)}


def load_draws(out, blocks: int | None = None) -> Draws:
    """The draws of the first `blocks` saved blocks of a run directory (all by default)."""
    files = sorted((Path(out) / "blocks").glob("block_*.npz"))[:blocks]
    if not files:
        raise InputError(f"{out}: no saved draws")
    parts = [dict(np.load(f)) for f in files]
    joined = {k: np.concatenate([p[k] for p in parts], axis=1) for k in parts[0]}
    return Draws({k[7:]: v for k, v in joined.items() if k.startswith("sample:")},
                 {k[5:]: v for k, v in joined.items() if k.startswith("stat:")})


def progress_printer(stream=sys.stderr):
    return lambda message: print(message, file=stream, flush=True)
