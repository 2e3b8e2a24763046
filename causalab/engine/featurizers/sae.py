"""The `sae` featurizer: a sparse-autoencoder dictionary, with the error term carried.

One class per SAELens architecture (standard ReLU, TopK, JumpReLU, gated), each SAELens's
own encode, and one decode and error-term contract shared by all. Tensor names and
orientations are SAELens's: ``W_enc`` (d, d_sae), ``W_dec`` (d_sae, d), ``b_enc``
(d_sae,), ``b_dec`` (d,), plus ``threshold`` (d_sae,) for JumpReLU and ``b_gate``,
``b_mag``, ``r_mag`` (d_sae,) for gated. A missing ``W_dec`` means tied weights
(``W_encᵀ``); missing biases are zeros. Never trainable. :func:`write_saelens_dir` writes
a dictionary in SAELens's on-disk format; reading one is compile/bundles/checks.py's.
"""
from __future__ import annotations

import json
import os

import torch
from torch import Tensor

from causalab.compile.bundles import saelens
from causalab.files import SAELENS_CONFIG, SAELENS_WEIGHTS

_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                       torch.float64: "F64"}
# The cfg.json format version written: SAELens reads ≥ 6 as its current format.
SAELENS_FORMAT = "6.0.0"
_DEFAULTS = saelens.SAELENS_DEFAULTS  # what a cfg.json that leaves a field out means
_APPLY_B_DEC = _DEFAULTS["apply_b_dec_to_input"]
_RESCALE = _DEFAULTS["rescale_acts_by_decoder_norm"]


def _float(value: Tensor | None, size: int) -> Tensor:
    return torch.zeros(size) if value is None else _dense(value)


def _dense(value: Tensor) -> Tensor:
    """fp32, row-major: a dictionary harvested in this run (``W_enc`` made as a transposed
    view) and the same one read back from its file must multiply alike, and a BLAS may sum a
    column-major operand in another order (last bits, seen on an AMD EPYC)."""
    return value.detach().float().contiguous()


class SAE:
    """Standard: f = ReLU((x − b_dec) W_enc + b_enc); decode(f) = f W_dec + b_dec;
    err = x − decode(f).

    ``inverse(f′, err, x)`` is decode(f′) + err, evaluated as x + (f′ − f) W_dec with f
    re-encoded from x. The two are equal in exact arithmetic (the biases cancel), but only
    the second returns x to the bit when f′ = f: (x − r) + r need not round back to x,
    while x + 0 always does. ``err`` is still returned for callers that inspect it.
    """

    kind = "sae"
    architecture = "standard"

    def __init__(self, W_enc: Tensor, W_dec: Tensor | None = None, b_enc: Tensor | None = None,
                 b_dec: Tensor | None = None, apply_b_dec_to_input: bool = _APPLY_B_DEC):
        d, d_sae = W_enc.shape
        self.W_enc = _dense(W_enc)
        self.W_dec = None if W_dec is None else _dense(W_dec)
        self.b_enc = _float(b_enc, d_sae)
        self.b_dec = _float(b_dec, d)
        self.apply_b_dec_to_input = apply_b_dec_to_input
        self.training = False

    @classmethod
    def from_bundle(cls, tensors: dict[str, Tensor], options: dict) -> "SAE":
        """The architecture ``options`` names (compile/bundles/checks.py's checked cfg), built."""
        architecture = ARCHITECTURES[options.get("architecture", _DEFAULTS["architecture"])]
        switches = {key: value for key, value in options.items() if key != "architecture"}
        return architecture(**tensors, **switches)

    @property
    def decoder(self) -> Tensor:
        """The (d_sae, d) matrix a latent's unit moves x by: W_dec, or W_encᵀ when tied."""
        return self.W_enc.T if self.W_dec is None else self.W_dec

    def sae_in(self, x: Tensor) -> Tensor:
        """x (..., d) minus b_dec where the cfg says so (SAELens's ``process_sae_in``)."""
        return x - self.b_dec.to(x.device) if self.apply_b_dec_to_input else x

    def pre(self, x: Tensor) -> Tensor:
        """x (..., d) -> the pre-activation (..., d_sae)."""
        return self.sae_in(x) @ self.W_enc.to(x.device) + self.b_enc.to(x.device)

    def encode(self, x: Tensor) -> Tensor:
        """x (..., d) float32 -> f (..., d_sae)."""
        return torch.relu(self.pre(x))

    def decode(self, f: Tensor) -> Tensor:
        """f (..., d_sae) -> (..., d)."""
        return f @ self.decoder.to(f.device) + self.b_dec.to(f.device)

    def featurize(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x (..., d) -> (f (..., d_sae), err = x − decode(f) (..., d)), float32."""
        with torch.autocast(x.device.type, enabled=False):
            x32 = x.float()
            f = self.encode(x32)
            return f, x32 - self.decode(f)

    def inverse(self, f: Tensor, err: Tensor, x: Tensor) -> Tensor:
        """(f′ (..., d_sae), err, x (..., d)) -> decode(f′) + err (..., d) in x's dtype."""
        with torch.autocast(x.device.type, enabled=False):
            x32 = x.float()
            delta = f.to(device=x.device, dtype=torch.float32) - self.encode(x32)
            return (x32 + delta @ self.decoder.to(x.device)).to(x.dtype)

    def parameters(self) -> list[Tensor]:
        return []

    def tensors(self) -> dict[str, Tensor]:
        """SAELens's state dict: what sae_weights.safetensors holds."""
        return {name: value for name, value in vars(self).items()
                if isinstance(value, Tensor)}

    def to(self, device):
        for name, value in self.tensors().items():
            setattr(self, name, value.to(device))
        return self


class TopKSAE(SAE):
    """TopK: f keeps the k largest pre-activations (then ReLU), zero elsewhere.

    With ``rescale_acts_by_decoder_norm`` SAELens ranks pre · |W_dec row| and decodes
    f / |W_dec row|; the decoder property carries that division, so inverse stays exact.
    """

    architecture = "topk"

    def __init__(self, W_enc: Tensor, W_dec: Tensor, b_enc: Tensor | None = None,
                 b_dec: Tensor | None = None, apply_b_dec_to_input: bool = _APPLY_B_DEC, *, k: int,
                 rescale_acts_by_decoder_norm: bool = _RESCALE):
        super().__init__(W_enc, W_dec, b_enc, b_dec, apply_b_dec_to_input)
        self.k = int(k)
        self.rescale_acts_by_decoder_norm = rescale_acts_by_decoder_norm

    @property
    def decoder(self) -> Tensor:
        if not self.rescale_acts_by_decoder_norm:
            return self.W_dec
        return self.W_dec / self.W_dec.norm(dim=-1, keepdim=True)

    def encode(self, x: Tensor) -> Tensor:
        pre = self.pre(x)
        if self.rescale_acts_by_decoder_norm:
            pre = pre * self.W_dec.to(x.device).norm(dim=-1)
        values, indices = torch.topk(pre, k=self.k, dim=-1, sorted=False)
        return torch.zeros_like(pre).scatter_(-1, indices, values.relu())


class JumpReLUSAE(SAE):
    """JumpReLU: f = ReLU(pre) where pre > threshold (per latent), else 0."""

    architecture = "jumprelu"

    def __init__(self, W_enc: Tensor, W_dec: Tensor, b_enc: Tensor | None = None,
                 b_dec: Tensor | None = None, apply_b_dec_to_input: bool = _APPLY_B_DEC, *,
                 threshold: Tensor):
        super().__init__(W_enc, W_dec, b_enc, b_dec, apply_b_dec_to_input)
        self.threshold = _dense(threshold)

    def encode(self, x: Tensor) -> Tensor:
        pre = self.pre(x)
        mask = (pre > self.threshold.to(x.device)).to(pre.dtype)
        return torch.relu(pre) * mask


class GatedSAE(SAE):
    """Gated: a gate path (W_enc, b_gate) says which latents fire; a magnitude path
    (W_enc · exp(r_mag), b_mag) says how much. There is no b_enc."""

    architecture = "gated"

    def __init__(self, W_enc: Tensor, W_dec: Tensor, b_dec: Tensor | None = None,
                 apply_b_dec_to_input: bool = _APPLY_B_DEC, *, b_gate: Tensor, b_mag: Tensor,
                 r_mag: Tensor):
        super().__init__(W_enc, W_dec, None, b_dec, apply_b_dec_to_input)
        del self.b_enc
        self.b_gate, self.b_mag, self.r_mag = (_dense(t) for t in (b_gate, b_mag, r_mag))

    def encode(self, x: Tensor) -> Tensor:
        sae_in, w_enc = self.sae_in(x), self.W_enc.to(x.device)
        active = (sae_in @ w_enc + self.b_gate.to(x.device) > 0).to(sae_in.dtype)
        magnitude = sae_in @ (w_enc * self.r_mag.to(x.device).exp()) + self.b_mag.to(x.device)
        return active * torch.relu(magnitude)


ARCHITECTURES = {"standard": SAE, "topk": TopKSAE, "jumprelu": JumpReLUSAE, "gated": GatedSAE}


def _header(tensors: dict[str, Tensor]) -> dict:
    return {name: {"dtype": _SAFETENSORS_DTYPES.get(t.dtype, str(t.dtype)), "shape": list(t.shape)}
            for name, t in tensors.items()}


def saelens_config(tensors: dict[str, Tensor], cfg: dict) -> dict:
    """The cfg.json SAELens ≥ 6 reads for ``tensors``: ``cfg`` (``architecture``,
    ``hook_name``, ``k`` for topk, anything else kept) with widths, dtype and defaults filled."""
    d_in, d_sae = tensors["W_enc"].shape
    dtype = str(tensors["W_enc"].dtype).removeprefix("torch.")
    metadata = {"sae_lens_version": SAELENS_FORMAT, **dict(cfg.get("metadata") or {})}
    if cfg.get("hook_name"):
        metadata["hook_name"] = cfg["hook_name"]
    out = {"architecture": _DEFAULTS["architecture"], "d_in": int(d_in), "d_sae": int(d_sae),
           "dtype": dtype, "device": "cpu",
           "apply_b_dec_to_input": _DEFAULTS["apply_b_dec_to_input"],
           "normalize_activations": _DEFAULTS["normalize_activations"],
           "reshape_activations": saelens.reshape_of(cfg.get("hook_name")),
           **{key: value for key, value in cfg.items() if key not in ("hook_name", "metadata")}}
    if out["architecture"] == "topk":
        out.setdefault("rescale_acts_by_decoder_norm", _DEFAULTS["rescale_acts_by_decoder_norm"])
    out["metadata"] = metadata
    return out


def write_saelens_dir(path: str | os.PathLike, tensors: dict[str, Tensor], cfg: dict, *,
                      stamp: dict[str, str] | None = None) -> str:
    """Write ``cfg.json`` + ``sae_weights.safetensors`` as SAELens's ``save_model`` does.

    ``tensors`` is the state dict (``W_enc`` (d_in, d_sae), ``W_dec``, ``b_enc``, ``b_dec``
    and the architecture's extras); ``cfg`` names at least ``hook_name`` (see
    compile.saelens.hook_name) and, unless standard, ``architecture`` (and ``k`` for topk).
    The cfg is checked as causalab checks one it loads, so what is written loads back.
    ``stamp`` (optional) goes into the weights' safetensors metadata, which SAELens ignores.
    The weights are written first and cfg.json last, each atomically: a directory with a
    cfg.json is complete. Returns ``path``.

    >>> import tempfile
    >>> t = {"W_enc": torch.eye(4), "W_dec": torch.eye(4), "b_enc": torch.zeros(4), "b_dec": torch.zeros(4)}
    >>> d = write_saelens_dir(tempfile.mkdtemp(), t, {"hook_name": "blocks.0.hook_resid_post"})
    >>> sorted(os.listdir(d))
    ['cfg.json', 'sae_weights.safetensors']
    """
    from causalab.engine import record

    plain = {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}
    config = saelens_config(plain, cfg)
    normalised = saelens.normalise(config, ("cfg",))
    site = saelens.hook_site(normalised.get("hook_name", ""))
    where = {"component": site[0], "layer": str(site[1])} if site else {}
    saelens.check(normalised, _header(plain), where, ("cfg",))
    os.makedirs(path, exist_ok=True)
    record.write_safetensors(os.path.join(path, SAELENS_WEIGHTS), plain, stamp)
    record.write_text(os.path.join(path, SAELENS_CONFIG), json.dumps(config))
    return str(path)
