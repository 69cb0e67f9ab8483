"""The head's training unroll drafts as serving does: ttt.unroll's output at chain depth s
equals the head's cache (gateway/feature_head.py HeadCache, what the proposer steps) fed
the same committed positions and chain tokens, so what `heads train` optimizes and what
`heads eval` measures is what the engine drafts. `heads generate` and `heads eval` run on a
tiny target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from gateway.feature_head import FeatureHead, HeadCache, HeadConfig, init_from_target, save_head
from models_registry.heads.cli import main as heads_main
from models_registry.heads.evaluate import accepted_lengths, summarize
from models_registry.heads.ttt import unroll
from tests.integration import tiny_models


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    return tiny_models.build(tmp_path_factory.mktemp("models")).parent / "tiny-target-v1"


def _head(target_dir: Path) -> tuple[FeatureHead, torch.nn.Module]:
    target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    torch.manual_seed(3)
    cfg = HeadConfig.for_target(target.config)
    w = target.get_output_embeddings().weight
    head = FeatureHead(cfg, target.get_input_embeddings().weight, w)
    init_from_target(head, target)
    return head.eval().requires_grad_(False), target


def _feats(head: FeatureHead, target: torch.nn.Module, seq: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        res = target(input_ids=seq, output_hidden_states=True)
    return torch.cat([res.hidden_states[i] for i in head.cfg.taps], dim=-1)[:, :-1]


def _cache_chain(
    head: FeatureHead, feats: torch.Tensor, tokens: torch.Tensor, p0: int, depth: int
) -> list[torch.Tensor]:
    """The head's outputs as drafting steps its cache: the committed positions 0..p0 from
    target features, then the chain fed its own output and the next token."""
    cache = HeadCache(head, 64)
    o = cache.step(head, head.fuse(feats[: p0 + 1]), tokens[: p0 + 1].tolist(), 0)[-1]
    outs = [o]
    for s in range(2, depth + 1):
        pos = p0 + s - 1
        o = cache.step(head, o[None], [int(tokens[pos])], pos)[0]
        outs.append(o)
    return outs


@torch.no_grad()
def test_the_training_unroll_is_what_drafting_computes(target_dir) -> None:
    head, target = _head(target_dir)
    seq = torch.randint(1, head.cfg.vocab, (1, 20), generator=torch.Generator().manual_seed(5))
    feats, tokens = _feats(head, target, seq), seq[:, 1:]
    depth = 4
    unrolled = list(unroll(head, feats, tokens, depth))  # (1, n, H) per depth
    for p0 in (0, 5, 11):
        drafted = _cache_chain(head, feats[0], tokens[0], p0, depth)
        for s, o in enumerate(drafted, start=1):
            assert torch.allclose(o, unrolled[s - 1][0, p0 + s - 1], atol=1e-5), (p0, s)
    # the control: features one position off (the classic misalignment) draft otherwise
    off = _cache_chain(head, feats[0, 1:], tokens[0], 5, depth)
    assert not torch.allclose(off[0], unrolled[0][0, 5], atol=1e-3)


def test_accepted_lengths_and_their_summary(target_dir) -> None:
    head, target = _head(target_dir)
    seq = torch.randint(1, head.cfg.vocab, (2, 24), generator=torch.Generator().manual_seed(1))
    lengths = accepted_lengths(head, target, seq, 8, 3)
    assert lengths.shape == (2, 24 - 1 - 3 - 8 + 1)
    assert int(lengths.min()) >= 0 and int(lengths.max()) <= 3
    fake = torch.tensor([[3, 0, 0, 0, 1, 0, 2, 0, 0]])  # walk: 3+1, 1+1, 2+1 -> 9 in 3
    out = summarize(fake, 3, (3, 1))
    assert out["tau_at_k"] == {"3": 3.0, "1": 1.5}  # k 1: 2, 1, 1, 2, 2, 1 in 6
    assert out["acceptance_at_depth"] == [round(3 / 9, 3), round(2 / 3, 3), 0.5]


def test_generate_and_eval_commands(target_dir, tmp_path, capsys) -> None:
    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(json.dumps({"text": t}) for t in tiny_models.CORPUS) + "\n")
    out = tmp_path / "gen.jsonl"
    common = ["generate", "--target", str(target_dir), "--data", str(data), "--out", str(out),
              "--prompt-tokens", "4", "--new", "6", "--batch", "2", "--quiet"]  # fmt: skip
    assert heads_main([*common, "--prompts", "3"]) == 0
    first = out.read_text().splitlines()
    assert len(first) == 3 and {"prompt", "completion"} <= json.loads(first[0]).keys()
    assert heads_main([*common, "--prompts", "5"]) == 0  # resumes: keeps the first three
    lines = out.read_text().splitlines()
    assert len(lines) == 5 and lines[:3] == first
    head, _ = _head(target_dir)
    save_head(head, tmp_path / "head", dtype=torch.float32)
    capsys.readouterr()
    args = ["eval", "--target", str(target_dir), "--head", str(tmp_path / "head"),
            "--data", str(data), "--prompts", "2", "--prompt-tokens", "4", "--new", "10",
            "--depth", "3", "--k", "2"]  # fmt: skip
    assert heads_main(args) == 0
    report = json.loads(capsys.readouterr().out)["heads"][str(tmp_path / "head")]
    assert len(report["acceptance_at_depth"]) == 3 and set(report["tau_at_k"]) == {"2"}
