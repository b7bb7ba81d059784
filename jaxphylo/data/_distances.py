"""All-pairs evolutionary distances between the sequences of an alignment.

Pairwise deletion: a site counts for a pair only where both sequences have one
unambiguous state. For DNA the pair's 4x4 divergence matrix `F[a, b]` (sites
with `a` in the first sequence and `b` in the second) gives every distance;
for proteins, matches and compared sites suffice. Both are matrix products of
0/1 one-hot codes, computed on the device one block of rows at a time, so
memory grows as `block x N`, never `N^2 x L`.

With `n = sum F`, `p` the proportion of differences, `P` (transitions) and `Q`
(transversions), and base frequencies `pi` of the whole alignment:

- `p`: the proportion of differences.
- `jc69`: `-3/4 ln(1 - 4p/3)`; `poisson` (protein): `-ln(1 - p)`.
- `k2p`: `-1/2 ln(1 - 2P - Q) - 1/4 ln(1 - 2Q)` (Kimura 1980).
- `tn93`: Tamura & Nei (1993) with purine (`P1`) and pyrimidine (`P2`) transitions.
- `logdet`: the paralinear form (Lake 1994), `-1/4 [ln det J - 1/2 ln(det Px det Py)]`
  with `J = F/n` and `Px`, `Py` its marginals on the diagonal.

A pair whose logarithm has no positive argument is *saturated*: its distance
is `saturated` (infinity unless given). A pair with no site to compare raises.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ._alignment import Alignment
from .._errors import InputError, ModelError

METHODS = {"dna": ("p", "jc69", "k2p", "tn93", "logdet"), "protein": ("p", "poisson")}
DEFAULT_METHOD = {"dna": "jc69", "protein": "poisson"}
PURINE_TRANSITION, PYRIMIDINE_TRANSITION = ((0, 2), (2, 0)), ((1, 3), (3, 1))  # A<->G, C<->T in ACGT order


def one_hot_states(alignment: Alignment) -> tuple[np.ndarray, np.ndarray]:
    """(codes [taxa, sites], lookup [codes, states]): a code's one-hot state, zeros if ambiguous."""
    codes, table, _ = alignment.encoded()
    resolved = table.sum(axis=1) == 1
    return codes, table * resolved[:, None]


def _safe_log(x):
    return jnp.log(jnp.where(x > 0, x, 1.0))


def _from_divergence(f: Float[Array, "B N 4 4"], method: str, pi) -> tuple[Array, Array]:
    """(distance, defined) for every pair from its divergence matrix."""
    n = jnp.sum(f, axis=(-2, -1))
    n_safe = jnp.where(n > 0, n, 1.0)
    same = jnp.trace(f, axis1=-2, axis2=-1)
    p = 1.0 - same / n_safe
    if method == "p":
        return p, n > 0
    if method == "jc69":
        a = 1.0 - 4.0 * p / 3.0
        return -0.75 * _safe_log(a), a > 0
    p1 = sum(f[..., i, j] for i, j in PURINE_TRANSITION) / n_safe
    p2 = sum(f[..., i, j] for i, j in PYRIMIDINE_TRANSITION) / n_safe
    q = p - p1 - p2
    if method == "k2p":
        a, b = 1.0 - 2.0 * (p1 + p2) - q, 1.0 - 2.0 * q
        return -0.5 * _safe_log(a) - 0.25 * _safe_log(b), (a > 0) & (b > 0)
    if method == "tn93":
        pa, pc, pg, pt = pi
        pr, py = pa + pg, pc + pt
        a1 = 1.0 - pr * p1 / (2 * pa * pg) - q / (2 * pr)
        a2 = 1.0 - py * p2 / (2 * pc * pt) - q / (2 * py)
        a3 = 1.0 - q / (2 * pr * py)
        d = (-2 * pa * pg / pr * _safe_log(a1) - 2 * pc * pt / py * _safe_log(a2)
             - 2 * (pr * py - pa * pg * py / pr - pc * pt * pr / py) * _safe_log(a3))
        return d, (a1 > 0) & (a2 > 0) & (a3 > 0)
    j = f / n_safe[..., None, None]
    det = jnp.linalg.det(j)
    marginals = jnp.prod(jnp.sum(j, axis=-1), axis=-1) * jnp.prod(jnp.sum(j, axis=-2), axis=-1)
    d = -0.25 * (_safe_log(det) - 0.5 * _safe_log(marginals))
    return d, (det > 0) & (marginals > 0)


@functools.partial(jax.jit, static_argnames=("dtype",))
def _one_hot(lookup, codes, weights, dtype):
    """`(everything [N, L, states], weighted)`: each sequence's state indicators, and the same with site `s`
    counted `weights[s]` times (`weights` None: the same array). One program: eagerly, these and the rows
    below were ~20 small programs, a tenth of a second of a warm start-up."""
    everything = jnp.asarray(lookup, dtype)[codes]
    return everything, everything if weights is None else everything * jnp.asarray(weights, dtype)[None, :, None]


@functools.partial(jax.jit, static_argnames=("size",))
def _rows(weighted, start, size: int):
    """Rows `start, start + 1, ...` of `weighted`, `size` of them, the last repeated past the end (one program
    for every block, the start traced)."""
    return weighted[jnp.minimum(start + jnp.arange(size), weighted.shape[0] - 1)]


@functools.partial(jax.jit, static_argnames=("method",))
def _dna_block(rows, everything, pi, method):
    """Distances from sequences `rows` [B, L, 4] (each site already times its weight) to all [N, L, 4]."""
    counts = jnp.einsum("isa,jsb->ijab", rows, everything, preferred_element_type=jnp.float32)
    return _from_divergence(counts.astype(jnp.float64), method, pi) + (jnp.sum(counts, axis=(-2, -1)),)


@functools.partial(jax.jit, static_argnames=("method",))
def _protein_block(rows, everything, method):
    matches = jnp.einsum("isa,jsa->ij", rows, everything, preferred_element_type=jnp.float32).astype(jnp.float64)
    n = jnp.einsum("is,js->ij", rows.sum(-1), everything.sum(-1), preferred_element_type=jnp.float32)
    n = n.astype(jnp.float64)
    p = 1.0 - matches / jnp.where(n > 0, n, 1.0)
    if method == "p":
        return p, n > 0, n
    return -_safe_log(1.0 - p), 1.0 - p > 0, n


def distances(
    alignment: Alignment, method: str | None = None, *, saturated: float = math.inf, block_size: int = 256,
    site_weights=None,
) -> Float[np.ndarray, "taxa taxa"]:
    """The symmetric matrix of `method` distances, rows and columns in `alignment.taxa` order.

    Methods: DNA `p`, `jc69` (default), `k2p`, `tn93`, `logdet`; protein `p`,
    `poisson` (default). Saturated pairs get `saturated` (default `inf`); give a
    finite value (say 5.0) to keep tree building going. `site_weights [sites]`
    (small non-negative integers) counts each column that many times: a
    bootstrap replicate's distances (column `s` drawn `w_s` times) equal those
    of the resampled alignment, without building it.
    """
    kind = alignment.alphabet.name
    if kind not in METHODS:
        raise ModelError(f"{alignment.source}: distances are for DNA or protein, not {kind} data")
    method = (method or DEFAULT_METHOD[kind]).lower()
    if method not in METHODS[kind]:
        raise ModelError(f"unknown {kind} distance {method!r}; choose from {', '.join(METHODS[kind])}")
    codes, lookup = one_hot_states(alignment)
    weights = np.ones(codes.shape[1]) if site_weights is None else np.asarray(site_weights, float)
    if weights.shape != (codes.shape[1],) or np.any(weights < 0) or np.any(weights > 256) or np.any(weights % 1):
        raise InputError(f"{alignment.source}: site_weights must be {codes.shape[1]} integers in 0..256, one per "
                         f"site")
    # 0/1 codes times integer weights up to 256 are exact in bfloat16 products with float32 sums (to 2^24 sites).
    dtype = jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32
    everything, weighted = _one_hot(lookup, codes, None if site_weights is None else weights, dtype)
    taxa = len(alignment.taxa)
    block_size = min(block_size, taxa)
    # Each state's count, site s counted w_s times, as a weighted histogram of the codes: the [taxa, sites,
    # states] product it replaces took 20 ms a call on carnivores, a bootstrap replicate's largest host cost
    # (host work that the shares of a bootstrap over several GPUs run under one interpreter lock).
    code_counts = np.bincount(codes.ravel(), weights=np.broadcast_to(weights, codes.shape).ravel(),
                              minlength=len(lookup))
    state_counts = code_counts @ lookup
    pi = jnp.asarray(state_counts / max(state_counts.sum(), 1.0))
    if method == "tn93" and np.any(state_counts == 0):
        raise InputError(f"{alignment.source}: TN93 needs every base present; base "
                         f"{'ACGT'[int(np.argmin(state_counts))]!r} never occurs")
    out = np.empty((taxa, taxa))
    for start in range(0, taxa, block_size):
        rows = _rows(weighted, np.int32(start), block_size)
        if kind == "dna":
            d, defined, n = _dna_block(rows, everything, pi, method)
        else:
            d, defined, n = _protein_block(rows, everything, method)
        d, defined, n = (np.asarray(x)[: taxa - start] for x in (d, defined, n))
        if np.any(n == 0):
            i, j = np.argwhere(n == 0)[0]
            raise InputError(f"{alignment.source}: taxa {alignment.taxa[start + i]!r} and "
                             f"{alignment.taxa[j]!r} share no unambiguous site; their distance is unknown")
        out[start:start + len(d)] = np.where(defined, d, saturated)
    np.fill_diagonal(out, 0.0)
    return np.maximum(out, 0.0)  # -0.0 and round-off below zero
