"""A feature-conditioned draft head (EAGLE-3 style): one decoder layer over the target's
own hidden states, pure torch, shared by the engine (drafting) and the registry (training).

Notation: the target's hidden states after layers a, b, c at position j (the taps, low,
middle and top; `taps` counts layers, 0 = the embeddings) are f_j = [h_a ; h_b ; h_c]
(3H). The head at position j takes

    g_j = fc(f_j)                      the fused target features, (H)
    x_{j+1}                            the token after position j (its embedding, the target's)

and runs one decoder layer whose attention reads [norm(e(x_{j+1})) ; norm(g_j)] (2H) and
whose residual stream starts at g_j. Its output o_j approximates the target's feature one
position on, and norm(o_j) through the target's output head gives the head's guess for
x_{j+2}. Drafting a chain: after the last committed position, the head feeds its own
output o_j in place of g_{j+1} with the token it just drafted, k times (the training-time
test of EAGLE-3, Li et al. 2025, trains it for exactly that: models_registry/heads).

The head's weights are its own (fc, the layer, the final norm); the embeddings and the
output head are the target's, passed in, or the rows of a reduced draft vocabulary.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

CONFIG_FILE = "head_config.json"
WEIGHTS_FILE = "head.safetensors"
VOCAB_FILE = "draft_vocab.json"


@dataclass(frozen=True)
class HeadConfig:
    """The head's shape, the target it reads and which of its layers it fuses."""

    hidden: int  # the target's hidden size H
    heads: int
    head_dim: int
    intermediate: int
    taps: tuple[int, ...]  # hidden-state indices of the target fused (0 = embeddings)
    target_layers: int
    vocab: int
    rope_theta: float = 10000.0
    eps: float = 1e-6

    @staticmethod
    def for_target(config: object) -> HeadConfig:
        """The taps for a target config: low, middle and top, after layers 2, L/2 and L
        (the final norm's output, what the output head reads; EAGLE-3 takes L - 3 on
        32-layer targets, which on a 12-layer one would leave a quarter of it unread)."""
        layers = int(getattr(config, "num_hidden_layers"))  # noqa: B009
        hidden = int(getattr(config, "hidden_size"))  # noqa: B009
        heads = int(getattr(config, "num_attention_heads"))  # noqa: B009
        rope = getattr(config, "rope_parameters", None) or {}
        theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
        taps = tuple(sorted({min(2, layers), max(1, layers // 2), layers}))
        return HeadConfig(
            hidden=hidden, heads=heads, head_dim=hidden // heads,
            intermediate=int(getattr(config, "intermediate_size", 4 * hidden)),
            taps=taps, target_layers=layers,
            vocab=int(getattr(config, "vocab_size")),  # noqa: B009
            rope_theta=theta, eps=float(getattr(config, "rms_norm_eps", 1e-6)),
        )  # fmt: skip

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @staticmethod
    def from_json(text: str) -> HeadConfig:
        data = json.loads(text)
        data["taps"] = tuple(data["taps"])
        return HeadConfig(**data)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def inverse_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """The rotary embedding's frequencies, (D/2,)."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))


def rotary_table(count: int, inv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles of positions 0..count-1, (count, D) each, with the
    frequencies inv (D/2,)."""
    pos = torch.arange(count, dtype=torch.float32, device=inv.device)
    ang = pos[:, None] * inv.float()  # (count, D/2)
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos(), emb.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of x (B, heads, T, D) with the cos and sin of its
    positions' angles (B, 1, T, D)."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


class FeatureHead(nn.Module):
    """The head's own weights; `embed` (V, H) and `out` (V or N, H) are the target's
    (frozen buffers); `out_ids` (N,): the rows of a reduced vocabulary, or None."""

    embed: torch.Tensor
    out: torch.Tensor
    out_ids: torch.Tensor | None
    inv_freq: torch.Tensor
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(
        self, cfg: HeadConfig, embed: torch.Tensor, out: torch.Tensor,
        out_ids: torch.Tensor | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        h, a = cfg.hidden, cfg.heads * cfg.head_dim
        self.cfg = cfg
        self.fc = nn.Linear(len(cfg.taps) * h, h, bias=False)
        self.emb_norm = RMSNorm(h, cfg.eps)
        self.hid_norm = RMSNorm(h, cfg.eps)
        self.qkv = nn.Linear(2 * h, 3 * a, bias=False)
        self.o = nn.Linear(a, h, bias=False)
        self.post_norm = RMSNorm(h, cfg.eps)
        self.gate_up = nn.Linear(h, 2 * cfg.intermediate, bias=False)
        self.down = nn.Linear(cfg.intermediate, h, bias=False)
        self.norm = RMSNorm(h, cfg.eps)
        self.register_buffer("embed", embed.detach(), persistent=False)
        self.register_buffer("out", out.detach(), persistent=False)
        self.register_buffer("out_ids", out_ids, persistent=False)
        inv = inverse_frequencies(cfg.head_dim, cfg.rope_theta).to(embed.device)
        self.register_buffer("inv_freq", inv, persistent=False)
        cos, sin = rotary_table(0, inv)  # grown on demand (`rope`)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def rope(self, pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (B, 1, T, D) of positions pos (B, T), from a table kept for the
        positions seen so far (grown to the next power of two past the largest)."""
        need = int(pos.max()) + 1
        if self.rope_cos.shape[0] < need:
            cos, sin = rotary_table(max(1024, 1 << (need - 1).bit_length()), self.inv_freq)
            self.rope_cos, self.rope_sin = cos, sin
        if self.rope_cos.dtype != dtype:
            self.rope_cos, self.rope_sin = self.rope_cos.to(dtype), self.rope_sin.to(dtype)
        return self.rope_cos[pos][:, None], self.rope_sin[pos][:, None]

    # -- the pieces (training composes them with its own attention mask) -------------------

    def fuse(self, feats: torch.Tensor) -> torch.Tensor:
        """(…, taps x H) target features -> (…, H)."""
        return self.fc(feats)

    def project(
        self, g: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v (B, heads, T, D) of positions with inputs g (B, T, H), tokens (B, T),
        at positions pos (B, T); k and q rotated."""
        e = F.embedding(tokens, self.embed)  # (B, T, H)
        x = torch.cat([self.emb_norm(e), self.hid_norm(g)], dim=-1)  # (B, T, 2H)
        b, t = tokens.shape
        c = self.cfg
        q, k, v = self.qkv(x).view(b, t, 3, c.heads, c.head_dim).permute(2, 0, 3, 1, 4)
        cos, sin = self.rope(pos, q.dtype)
        return rotate(q, cos, sin), rotate(k, cos, sin), v

    def finish(self, g: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The layer's output o (B, T, H) from the attention's (B, heads, T, D)."""
        b, _, t, _ = attn.shape
        h = g + self.o(attn.transpose(1, 2).reshape(b, t, -1))
        gate, up = self.gate_up(self.post_norm(h)).chunk(2, dim=-1)
        return h + self.down(F.silu(gate) * up)

    def logits(self, o: torch.Tensor) -> torch.Tensor:
        """(…, H) -> logits over the head's vocabulary, (…, V) or (…, N) with a reduced
        one (`full_logits` puts those back into V)."""
        return F.linear(self.norm(o), self.out)

    def full_logits(self, o: torch.Tensor) -> torch.Tensor:
        """(…, H) -> (…, V): -inf outside a reduced vocabulary."""
        z = self.logits(o)
        if self.out_ids is None:
            return z
        full = z.new_full((*z.shape[:-1], self.cfg.vocab), float("-inf"))
        return full.index_copy_(-1, self.out_ids, z)


class HeadCache:
    """One row's keys and values for the head: (1, heads, capacity, D), `length` used."""

    def __init__(self, head: FeatureHead, capacity: int) -> None:
        c = head.cfg
        p = head.fc.weight
        self.k = p.new_zeros(1, c.heads, capacity, c.head_dim)
        self.v = p.new_zeros(1, c.heads, capacity, c.head_dim)
        self.pos = torch.zeros(capacity, dtype=torch.long, device=p.device)
        self.length = 0

    def step(
        self, head: FeatureHead, g: torch.Tensor, tokens: list[int], start: int
    ) -> torch.Tensor:
        """Feed positions start.. (g (T, H), tokens (T,)) after the cached ones: the head's
        outputs o (T, H). Raises ValueError past the capacity."""
        t = len(tokens)
        n = self.length
        if n + t > self.k.shape[2]:
            raise ValueError("the head's cache is full")
        dev = g.device
        pos = torch.arange(start, start + t, device=dev)[None]  # (1, T)
        ids = torch.tensor([tokens], dtype=torch.long, device=dev)  # (1, T)
        q, k, v = head.project(g[None], ids, pos)  # (1, heads, T, D)
        self.k[:, :, n : n + t] = k
        self.v[:, :, n : n + t] = v
        self.length = n + t
        keys, values = self.k[:, :, : n + t], self.v[:, :, : n + t]
        mask = None
        if t > 1:  # query i sees the cached keys and the new ones up to its own
            mask = torch.ones(t, n + t, dtype=torch.bool, device=dev).tril(n)
        attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return head.finish(g[None], attn)[0]  # (T, H)


def load_head(
    path: str | Path, embed: torch.Tensor, out: torch.Tensor, reduced: bool = True
) -> FeatureHead:
    """The head saved in `path` (head_config.json, head.safetensors; a draft_vocab.json
    gives it a reduced vocabulary unless reduced=False) on the target's embedding (V, H)
    and output head (V, H), in their dtype and device."""
    from safetensors.torch import load_file

    root = Path(path)
    cfg = HeadConfig.from_json((root / CONFIG_FILE).read_text())
    if tuple(embed.shape) != (cfg.vocab, cfg.hidden) or tuple(out.shape) != tuple(embed.shape):
        raise ValueError(
            f"{root}: the head was trained for a target of vocabulary {cfg.vocab} x hidden "
            f"{cfg.hidden}, this target's embeddings are {tuple(embed.shape)}"
        )
    ids = None
    vocab = root / VOCAB_FILE
    if reduced and vocab.exists():
        ids = torch.tensor(sorted(set(json.loads(vocab.read_text())["token_ids"])))
        ids = ids.to(out.device)
        out = out[ids]
    head = FeatureHead(cfg, embed, out, ids)
    state = load_file(str(root / WEIGHTS_FILE))
    head.load_state_dict({k: v.to(embed.dtype) for k, v in state.items()})
    head.to(device=embed.device, dtype=embed.dtype)
    head.eval().requires_grad_(False)
    return head


def save_head(head: FeatureHead, path: str | Path, dtype: torch.dtype = torch.float16) -> None:
    """Write head_config.json and head.safetensors (its own weights, in `dtype`)."""
    from safetensors.torch import save_file

    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    (root / CONFIG_FILE).write_text(head.cfg.to_json() + "\n")
    state = {k: v.detach().to(dtype).contiguous() for k, v in head.state_dict().items()}
    save_file(state, str(root / WEIGHTS_FILE))


def init_from_target(head: FeatureHead, target: nn.Module) -> None:
    """Start the final norm from the target's (its output head was trained after it)."""
    norm = getattr(getattr(target, "base_model", target), "norm", None)
    w = getattr(norm, "weight", None)
    if isinstance(w, torch.Tensor) and w.shape == head.norm.weight.shape:
        with torch.no_grad():
            head.norm.weight.copy_(w)
    for lin in (head.qkv, head.o, head.gate_up, head.down, head.fc):
        nn.init.normal_(lin.weight, std=1 / math.sqrt(lin.weight.shape[1]))
    with torch.no_grad():
        head.o.weight.mul_(0.5)
        head.down.weight.mul_(0.5)
