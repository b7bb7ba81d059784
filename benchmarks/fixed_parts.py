"""MC³'s generation with a fixed model's eigensystem and rate categories computed once, against computed every
generation (issue #38: transition matrices cached while the model's parameters do not move).

    python benchmarks/fixed_parts.py [--data DIR] [--model JC] [--generations 5000]

2 runs x 4 chains of `jaxphylo mcmc`'s kernel (kept partials) on DS1 under JC69, whose model has no free
parameter: `starting_state` gives the template `Model.with_fixed_parts` made (`Decomposed`, `FixedCategories`);
the other column swaps the plain parsed model back in, so that every generation decomposes it again. One block of
`--generations` after a compiling one, three times each, alternating; ms per generation of all 8 chains.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import equinox as eqx
import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxphylo as jp  # noqa: E402
from _common import SHARED_DATA, device_record, save  # noqa: E402
from jaxphylo.inference.mc3 import MC3Settings, run_block, starting_state  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(SHARED_DATA / "DS1"))
    parser.add_argument("--model", default="JC", help="a model with every parameter fixed")
    parser.add_argument("--generations", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    alignment = jp.read_alignment(Path(args.data) / "alignment.fasta")
    settings = MC3Settings(runs=2, chains=4, generations=args.generations, sample_every=100,
                           block=args.generations // 100)
    posterior, state, key = starting_state(alignment, args.model, settings)
    variants = {"computed once": posterior,
                "every generation": eqx.tree_at(lambda p: p.coordinates.template, posterior,
                                                jp.parse_model(args.model, alignment=alignment))}
    count, tune = jnp.asarray(settings.block), jnp.asarray(settings.tune_generations)
    times: dict = {name: [] for name in variants}
    for name, variant in variants.items():
        jax.block_until_ready(run_block(state, key, variant, settings.program(), count, tune))  # compile
    for _ in range(args.repeats):
        for name, variant in variants.items():
            began = time.perf_counter()
            jax.block_until_ready(run_block(state, key, variant, settings.program(), count, tune))
            times[name].append(1e3 * (time.perf_counter() - began) / args.generations)
    record = device_record("fixed_parts")
    record.update(data=Path(args.data).name, model=args.model, generations=args.generations,
                  template=type(posterior.coordinates.template.substitution).__name__,
                  ms_per_generation={name: float(np.median(t)) for name, t in times.items()}, runs=times)
    print(f"{'model':<20}{'ms per generation (2 runs x 4 chains)':>40}")
    for name, t in times.items():
        print(f"{name:<20}{np.median(t):>40.4f}")
    save(record, args.out, f"fixed_parts-{record['data']}")


if __name__ == "__main__":
    main()
