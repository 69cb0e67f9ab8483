"""A small feature head for a tiny test target, trained in a few seconds on the target's own
greedy continuations (the recipe of models_registry/heads, in miniature), saved and loaded
the way the registry loads one."""

from __future__ import annotations

from pathlib import Path

import torch

from gateway.engine import DecodeRequest, Engine, LoadedModel, SamplingParams
from gateway.engine.proposers.head import load_head_model
from gateway.feature_head import FeatureHead, HeadConfig, init_from_target, save_head
from models_registry.heads.ttt import ttt_loss


def target_sequences(eng: Engine, n: int, length: int, seed: int = 0) -> torch.Tensor:
    """n greedy continuations of random 3-token prompts, (n, length): the same for the same
    seed (the tests decode from these prompts, whose continuations the head learned)."""
    gen = torch.Generator().manual_seed(seed)
    vocab = eng.target.vocab_size
    rows = []
    while len(rows) < n:
        prompt = tuple(int(t) for t in torch.randint(1, vocab, (3,), generator=gen))
        res = eng.run(DecodeRequest(prompt, SamplingParams(temperature=0.0, max_tokens=length)))
        seq = [*prompt, *res.token_ids][:length]
        if len(seq) == length:
            rows.append(seq)
    return torch.tensor(rows)


def train_tiny_head(eng: Engine, path: Path, steps: int = 150, ttt: int = 3) -> LoadedModel:
    """Train a head for `eng`'s target, write it to `path`, load it as a draft."""
    model = eng.target.model
    torch.manual_seed(0)
    cfg = HeadConfig.for_target(model.config)
    out_w = model.get_output_embeddings().weight
    head = FeatureHead(cfg, model.get_input_embeddings().weight, out_w)
    init_from_target(head, model)
    data = target_sequences(eng, 24, 24)
    with torch.no_grad():
        res = model(input_ids=data, output_hidden_states=True)
        feats = torch.cat([res.hidden_states[i] for i in cfg.taps], dim=-1)[:, :-1]
        teacher = torch.softmax(res.logits[:, 1:].float(), dim=-1)
    opt = torch.optim.Adam(head.parameters(), lr=1e-2)
    with torch.enable_grad():
        for _ in range(steps):
            loss, _ = ttt_loss(head, feats, data[:, 1:], teacher, ttt)
            opt.zero_grad()
            loss.backward()
            opt.step()
    save_head(head, path, dtype=torch.float32)
    return load_head_model(str(path), eng.target)
