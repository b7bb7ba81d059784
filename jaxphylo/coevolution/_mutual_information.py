"""2- and 3-point mutual information (MI) of alignment columns (Waechter et al. 2012).

Every column is a discrete variable over the alphabet's states plus two more
symbols, gap (`-`, `.`) and unknown (anything ambiguous): 6 for DNA, 22 for
proteins. With entropies from the empirical frequencies,

    MI_ij  = H_i + H_j - H_ij                      (so MI_ii = H_i)
    MI_ijk = H_i + H_j + H_k - H_ij - H_ik - H_jk + H_ijk   (co-information; MI_iii = H_i)

Joint counts are matrix products of one-hot columns, `n_ij(a, b) = sum_s
O_si(a) O_sj(b)`, exact in bfloat16 products with float32 sums, and
`H = ln n - sum n ln n / n` takes `n ln n` from an exact float64 table of
integers. The null model shuffles every column independently (each keeps its
composition, so `H_i` stays and only joint entropies move); shuffles run in
batches under `vmap`, and 3-point counts in blocks of the L^3 tensor.
"""

from __future__ import annotations

import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from ..data import Alignment
from .._errors import ModelError

GAP_SYMBOLS = "-."
BATCH_BYTES = 4 << 30  # device memory for one batch of shuffled counts


class MutualInformation(eqx.Module):
    """MI of every column pair `[L, L]` (or triple `[L, L, L]`) and its shuffling null.

    `zscore = (mi - null_mean) / null_std` (0 where the null does not vary: the
    diagonal and constant columns); `percentile` is the mid-rank of `mi` among
    the shuffled values, `100 (below + ties/2) / shuffles`. `apc` (2-point
    only) is the average-product-corrected MI of Dunn et al. (2008),
    `MI_ij - MI_i. MI_.j / MI_..` over off-diagonal pairs.
    """

    mi: Float[Array, "..."]
    null_mean: Float[Array, "..."]
    null_std: Float[Array, "..."]
    zscore: Float[Array, "..."]
    percentile: Float[Array, "..."]
    apc: Float[Array, "..."] | None
    entropy: Float[Array, " L"]
    shuffles: int = eqx.field(static=True)
    base: float = eqx.field(static=True)


def column_symbols(alignment: Alignment) -> tuple[Int[np.ndarray, "sequences columns"], int]:
    """Each cell as a symbol: its state if unambiguous, then gap, then unknown; and the symbol count."""
    codes, table, symbols = alignment.encoded()
    states = table.shape[1]
    resolved = table.sum(axis=1) == 1
    symbol_of_code = np.where(resolved, table.argmax(axis=1), states + 1)
    symbol_of_code[[s in GAP_SYMBOLS for s in symbols]] = states
    return symbol_of_code[codes].astype(np.int32), states + 2


def _n_log_n(count: int) -> Float[Array, " counts"]:
    n = np.arange(count + 1, dtype=np.float64)
    return jnp.asarray(n * np.log(np.where(n > 0, n, 1.0)))


def _one_hot(symbols, k):
    return jax.nn.one_hot(symbols, k, dtype=jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32)


def _entropy_from_counts(counts, table, n, axes):
    """`H = ln n - sum n ln n / n` over `axes` of integer-valued `counts`."""
    return math.log(n) - jnp.sum(table[counts.astype(jnp.int32)], axis=axes) / n


def _pair_entropies(onehot, table, n):
    """`H_ij` for all pairs from one-hot `[n, L, K]`."""
    counts = jnp.einsum("sia,sjb->ijab", onehot, onehot, preferred_element_type=jnp.float32)
    return _entropy_from_counts(counts, table, n, (-2, -1))


def _triple_entropies(onehot, table, n, i0, j0, bi, bj):
    """`H_ijk` for `i` in `[i0, i0+bi)`, `j` in `[j0, j0+bj)`, all `k`."""
    rows = jax.lax.dynamic_slice_in_dim(onehot, i0, bi, axis=1)
    middle = jax.lax.dynamic_slice_in_dim(onehot, j0, bj, axis=1)
    counts = jnp.einsum("sia,sjb,skc->ijkabc", rows, middle, onehot, preferred_element_type=jnp.float32)
    return _entropy_from_counts(counts, table, n, (-3, -2, -1))


def _shuffle(key, symbols):
    """Permute every column (axis 0 is sequences) independently."""
    keys = jax.random.split(key, symbols.shape[1])
    return jax.vmap(lambda k, column: jax.random.permutation(k, column), in_axes=(0, 1), out_axes=1)(keys, symbols)


def _mi2(pair):
    h = jnp.diagonal(pair, axis1=-2, axis2=-1)
    return h[..., :, None] + h[..., None, :] - pair


def _mi3(pair, triple_block, i0, j0, bi, bj):
    """Co-information for a block, from full pair entropies and the block's triple entropies."""
    h = jnp.diagonal(pair, axis1=-2, axis2=-1)
    hi = jax.lax.dynamic_slice_in_dim(h, i0, bi, axis=-1)
    hj = jax.lax.dynamic_slice_in_dim(h, j0, bj, axis=-1)
    pij = jax.lax.dynamic_slice_in_dim(jax.lax.dynamic_slice_in_dim(pair, i0, bi, axis=-2), j0, bj, axis=-1)
    pik = jax.lax.dynamic_slice_in_dim(pair, i0, bi, axis=-2)
    pjk = jax.lax.dynamic_slice_in_dim(pair, j0, bj, axis=-2)
    return (hi[..., :, None, None] + hj[..., None, :, None] + h[..., None, None, :]
            - pij[..., :, :, None] - pik[..., :, None, :] - pjk[..., None, :, :] + triple_block)


@functools.partial(jax.jit, static_argnames=("k", "order", "bi", "bj"))
def _mi_block(symbols, table, k, order, i0, j0, bi, bj):
    """MI for one block (all pairs when `order == 2`) of one symbol matrix `[n, L]`."""
    n = symbols.shape[0]
    onehot = _one_hot(symbols, k)
    pair = _pair_entropies(onehot, table, n)
    if order == 2:
        return _mi2(pair)
    return _mi3(pair, _triple_entropies(onehot, table, n, i0, j0, bi, bj), i0, j0, bi, bj)


@functools.partial(jax.jit, static_argnames=("k", "order", "bi", "bj"))
def _null_block(keys, symbols, observed, table, k, order, i0, j0, bi, bj):
    """Sums over a batch of shuffles: (sum MI, sum MI^2, # below observed, # tied)."""
    def one(key):
        return _mi_block(_shuffle(key, symbols), table, k, order, i0, j0, bi, bj)

    values = jax.lax.map(one, keys) if order == 3 else jax.vmap(one)(keys)
    tie = jnp.abs(values - observed) <= 1e-9 * jnp.maximum(1.0, jnp.abs(observed))
    return (jnp.sum(values, 0), jnp.sum(values * values, 0),
            jnp.sum((values < observed) & ~tie, 0), jnp.sum(tie, 0))


def _blocks(length, k, order):
    """Block sizes (bi, bj) so a 3-point block's counts stay near BATCH_BYTES."""
    if order == 2:
        return length, length
    per_ij = length * k ** 3 * 4 * 3  # counts, table lookups and sums per (i, j)
    bj = max(1, min(length, BATCH_BYTES // (per_ij * length)))
    bi = max(1, min(length, BATCH_BYTES // (per_ij * bj)))
    return bi, bj


def mutual_information(
    alignment: Alignment, order: int = 2, shuffles: int = 1000, seed: int = 0, base: float | None = None,
    batch: int | None = None, progress: bool = False,
) -> MutualInformation:
    """MI of every pair (`order=2`) or triple (`order=3`) of columns, with a shuffling null.

    Natural-log units unless `base` (2 for bits). Fixed `seed`, fixed result.
    """
    if order not in (2, 3):
        raise ModelError(f"order must be 2 or 3, not {order!r}")
    if shuffles < 0:
        raise ModelError(f"shuffles must be >= 0, not {shuffles}")
    symbols_np, k = column_symbols(alignment)
    symbols = jnp.asarray(symbols_np)
    n, length = symbols_np.shape
    table = _n_log_n(n)
    bi, bj = _blocks(length, k, order)
    if batch is None:  # 2-point: shuffles side by side (vmap); 3-point: one after another (lax.map)
        batch = max(1, min(64, BATCH_BYTES // ((length * k) ** 2 * 16))) if order == 2 else 64
    shape = (length,) * order
    mi = np.zeros(shape)
    total, squares = np.zeros(shape), np.zeros(shape)
    below, ties = np.zeros(shape), np.zeros(shape)
    keys = jax.random.split(jax.random.key(seed), max(shuffles, 1))[:shuffles]
    blocks = [(i0, j0) for i0 in range(0, length, bi) for j0 in range(0, length, bj)] if order == 3 else [(0, 0)]
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(blocks) * shuffles, desc=f"{order}-point MI", unit="shuffle")
    for i0, j0 in blocks:
        i1, j1 = min(i0 + bi, length), min(j0 + bj, length)
        i_start, j_start = min(i0, length - bi), min(j0, length - bj)  # last blocks overlap, same values
        where = (slice(i0, i1), slice(j0, j1)) if order == 3 else ()
        inner = (slice(i0 - i_start, i1 - i_start), slice(j0 - j_start, j1 - j_start)) if order == 3 else ()
        observed = _mi_block(symbols, table, k, order, i_start, j_start, bi, bj)
        mi[where] = np.asarray(observed)[inner]
        for start in range(0, shuffles, batch):
            sums = _null_block(keys[start:start + batch], symbols, observed, table, k, order,
                               i_start, j_start, bi, bj)
            for accumulator, value in zip((total, squares, below, ties), sums):
                accumulator[where] += np.asarray(value, np.float64)[inner]
            if bar is not None:
                bar.update(len(keys[start:start + batch]))
    if bar is not None:
        bar.close()
    return _summarise(mi, total, squares, below, ties, shuffles, order, base)


def _summarise(mi, total, squares, below, ties, shuffles, order, base):
    scale = 1.0 / math.log(base) if base else 1.0
    count = max(shuffles, 1)
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean * mean, 0.0))
    constant = std <= 1e-12 * np.maximum(1.0, np.abs(mean))
    zscore = np.where(constant, 0.0, (mi - mean) / np.where(constant, 1.0, std))
    percentile = 100.0 * (below + 0.5 * ties) / count
    entropy = np.diagonal(mi) if order == 2 else np.einsum("iii->i", mi)
    apc = None
    if order == 2:
        off = ~np.eye(len(mi), dtype=bool)
        row = np.where(off, mi, 0.0).sum(axis=1) / max(len(mi) - 1, 1)
        overall = mi[off].mean() if off.any() else 0.0
        apc = np.where(off, mi - np.outer(row, row) / (overall if overall > 0 else 1.0), 0.0) * scale
    return MutualInformation(
        mi=mi * scale, null_mean=mean * scale, null_std=std * scale, zscore=zscore, percentile=percentile,
        apc=apc, entropy=entropy * scale, shuffles=shuffles, base=base or math.e,
    )
