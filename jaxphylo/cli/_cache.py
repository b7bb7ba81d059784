"""`jaxphylo cache info|clear`: where the compiled programs are kept, how many and how large; remove them.

The cache itself is `jaxphylo.runtime`'s (`enable_compilation_cache`): on by default in the user's cache folder,
`JAXPHYLO_CACHE_DIR` moves it or (`off`) turns it off, `JAXPHYLO_CACHE_MAX_SIZE` caps it.
"""

from __future__ import annotations

import os
from pathlib import Path


def add_command(commands) -> None:
    cache = commands.add_parser("cache", help="the compiled-program cache: where it is and its size (info), or empty "
                                              "it (clear)")
    cache.add_argument("action", choices=("info", "clear"))
    cache.set_defaults(run=run)


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


def run(args) -> None:
    import jax

    from ..runtime import (
        ENVIRONMENT, SIZE_ENVIRONMENT, cache_dir, cache_info, clear_cache, default_cache_dir, enabled_cache_dir,
        max_cache_bytes,
    )

    folder = cache_dir()
    if args.action == "clear":
        if folder is None:
            print(f"cache: off ({ENVIRONMENT}={os.environ[ENVIRONMENT]}); nothing to clear")
            return
        print(f"cache: removed {clear_cache(folder)} compiled programs from {folder}")
        return
    if folder is None:
        print(f"cache: off ({ENVIRONMENT}={os.environ[ENVIRONMENT]})")
    else:
        info = cache_info(folder)
        where = f"{ENVIRONMENT}" if os.environ.get(ENVIRONMENT) else f"default; {ENVIRONMENT} moves it or turns it off"
        print(f"cache: {folder} ({where})\n"
              f"  {info.entries} compiled programs, {_size(info.bytes)} of at most {_size(max_cache_bytes())} "
              f"({SIZE_ENVIRONMENT})")
        if folder != default_cache_dir() and default_cache_dir().is_dir():
            print(f"  the default folder {default_cache_dir()} holds {cache_info(default_cache_dir()).entries} more")
    if enabled_cache_dir() is None and (jax_folder := jax.config.jax_compilation_cache_dir):
        print(f"  in use instead: JAX's own cache {jax_folder} (JAX_COMPILATION_CACHE_DIR or jax.config), "
              f"{cache_info(Path(jax_folder)).entries} compiled programs")
    elif not jax.config.jax_enable_compilation_cache:
        print("  JAX's compilation cache is switched off (jax_enable_compilation_cache)")
