"""The pieces the target (:mod:`tritree.model.kimi_k2`) and the draft (:mod:`tritree.model.dflash`) share:
RMSNorm, the linear map and the SwiGLU MLP, half-rotary RoPE with its (YaRN) frequencies, and random
parameters for a table of shapes. Pure functions of tensors; nothing here knows either model's config.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def rms_norm(x, weight, eps):
    """``weight * x / rms(x)`` over the last dimension, in float32 at least: ``F.rms_norm``, one fused
    kernel on a GPU (16-bit inputs accumulated in float32). A weight of ``x``'s dtype is applied inside it
    before the one rounding to that dtype (transformers rounds, then multiplies: the two differ by at
    most one unit in the last place); a weight of another dtype after, in the promoted dtype."""
    if weight.dtype == x.dtype:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return weight * F.rms_norm(x, (x.shape[-1],), eps=eps)


def linear(x, w, b=None):
    """``x @ w.T (+ b)`` with the weight (and bias) cast to the activations' dtype."""
    return F.linear(x, w.to(x.dtype), None if b is None else b.to(x.dtype))


# --------------------------------------------------------------------------------------------------
# RoPE (halves layout: channel i pairs with i + d/2)
# --------------------------------------------------------------------------------------------------

def yarn_inv_freq(d: int, base: float, rope_scaling: dict | None, device=None) -> torch.Tensor:
    """Inverse frequencies of a ``d``-channel rope, YaRN-corrected when ``rope_scaling`` says so
    (docs/SPEC.md section 2; the ramp of the YaRN paper, as transformers computes it), float32 [d/2]."""
    # Built on the device it is used on: a host-to-device copy cannot be captured in a CUDA graph.
    freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d))
    rs = rope_scaling or {}
    if rs.get("type", rs.get("rope_type")) not in ("yarn", "deepseek_yarn"):
        return freq
    factor = float(rs["factor"])
    L0 = float(rs["original_max_position_embeddings"])
    beta_fast, beta_slow = float(rs.get("beta_fast") or 32), float(rs.get("beta_slow") or 1)

    def corr(r):
        return d * math.log(L0 / (2 * math.pi * r)) / (2 * math.log(base))

    low, high = corr(beta_fast), corr(beta_slow)
    if rs.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float32, device=device) - low) / (high - low)).clamp(0, 1)
    return freq / factor * ramp + freq * (1 - ramp)


_INV_FREQ: dict = {}


def inv_freq_kept(d: int, base: float, rope_scaling: dict | None, device=None) -> torch.Tensor:
    """:func:`yarn_inv_freq`, computed once per (``d``, ``base``, ``rope_scaling``, device) and kept (a dozen
    small kernels otherwise on every forward). Read-only. First met inside a CUDA-graph capture, where it
    is computed at replay, it is not kept."""
    device = torch.device("cpu" if device is None else device)
    key = (d, float(base), repr(sorted((rope_scaling or {}).items())), device)
    t = _INV_FREQ.get(key)
    if t is None:
        t = yarn_inv_freq(d, base, rope_scaling, device)
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return t
        _INV_FREQ[key] = t  # never evicted: captured graphs may hold its address
    return t


def cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, dtype, amplitude: float = 1.0):
    """The rope tables of :func:`apply_rope` at integer ``positions``, ``[..., 2 * len(inv_freq)]`` each,
    computed in float32 and cast to ``dtype``: ``cos`` in the halves layout, and ``sin`` with its first
    half negated (``[-sin, sin]``), times ``amplitude``."""
    ang = positions[..., None].float() * inv_freq
    c, s = ang.cos(), ang.sin()
    if amplitude != 1.0:
        c, s = c * amplitude, s * amplitude
    return torch.cat([c, c], dim=-1).to(dtype), torch.cat([-s, s], dim=-1).to(dtype)


def apply_rope(x, cos, sin):
    """Half-rotary RoPE ``x * cos + [-x2, x1] * [sin, sin]`` with the tables of :func:`cos_sin` (``sin``
    signed there, so the rotation is a roll by half the width); ``x [..., rope]``, the tables broadcastable."""
    return torch.addcmul(x * cos, torch.roll(x, x.shape[-1] // 2, dims=-1), sin)


def rope_permutation(d: int) -> torch.Tensor:
    """Checkpoint interleaved pairs (2i, 2i+1) -> halves: P = [0, 2, ..., d-2, 1, 3, ..., d-1]."""
    return torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])


# --------------------------------------------------------------------------------------------------
# Random parameters
# --------------------------------------------------------------------------------------------------

def random_params(shapes: dict[str, tuple], seed: int = 0, dtype=torch.float32, device="cpu",
                  float32=()) -> dict:
    """Random parameters of the given shapes, drawn in ``shapes`` order from one generator seeded
    ``seed``: norm weights ``1 + 0.1 N(0, 1)``, biases ``0.05 N(0, 1)``, matrices ``N(0, 1 / fan_in)``;
    names containing one of the ``float32`` substrings are float32, the rest ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith("bias"):
            t = 0.05 * torch.randn(shape, generator=g)
        else:
            t = torch.randn(shape, generator=g) / math.sqrt(shape[-1])
        out[name] = t.to(device=device, dtype=torch.float32 if any(k in name for k in float32) else dtype)
    return out
