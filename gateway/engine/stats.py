"""Per-request decoding counters: plain data (exporters live in gateway/http)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DecodeStats:
    """Counters of one request.

    drafted / accepted / rejected count draft tokens (rejected = drafted - accepted);
    accepted_per_pos[j] counts acceptances at draft position j; num_drafts counts verify
    steps with at least one drafted token. Times are wall seconds, and draft_s + verify_s +
    other_s is the whole request: proposing (draft_s: draft forwards, or the lookup of a
    model-free proposer), verify steps (verify_s: masks, the target forward, acceptance,
    logprobs) and everything else (other_s: the prefill, of which prefill_s, detokenizing,
    stop strings, and time the consumer held the stream). c = mean draft forward time /
    mean target verify forward time (None without a draft model).
    """

    mode: str = "standard"
    proposer: str | None = None
    drafted: int = 0
    accepted: int = 0
    rejected: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    num_drafts: int = 0
    rejected_steps: int = 0  # verify steps that rejected a drafted token (accepted < drafted)
    target_forwards: int = 0
    draft_forwards: int = 0
    generated_tokens: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    prefill_s: float = 0.0
    other_s: float = 0.0
    c: float | None = None
    k_history: list[int] = field(default_factory=list)
    final_k: int | None = None
    tokens_per_target_forward: float = 0.0  # generated tokens / target forwards after prefill
    paused_steps: int = 0  # batch steps on which this speculative request drafted nothing
    batch_steps: int = 0  # verify forwards it shared with a batch ...
    batch_rows: int = 0  # ... and the rows in them, summed
    cached_prompt_tokens: int = 0  # prompt tokens reused from a kept prefix (batch/prefix.py)

    @property
    def mean_batch_rows(self) -> float | None:
        """Rows in this request's verify forwards, on average (None alone)."""
        return self.batch_rows / self.batch_steps if self.batch_steps else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def token_acceptance(self) -> float | None:
        """The per-token acceptance rate a of E(a, k): accepted / (accepted + rejected steps),
        its estimate when each drafted token is accepted with probability a until the first
        rejection (policies/costmodel.py `update_history`)."""
        tried = self.accepted + self.rejected_steps
        return self.accepted / tried if tried else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens emitted per verify step that had a draft: 1 + accepted / num_drafts."""
        return 1.0 + self.accepted / self.num_drafts if self.num_drafts else None

    def finish(self, generated_tokens: int, target_forwards: int, draft_forwards: int) -> None:
        """Fill the end-of-request fields (plain data, so asdict() carries them)."""
        self.generated_tokens = generated_tokens
        self.target_forwards = target_forwards
        self.draft_forwards = draft_forwards
        decode_forwards = target_forwards - (1 if self.prefill_s > 0 else 0)
        self.tokens_per_target_forward = (
            generated_tokens / decode_forwards if decode_forwards > 0 else 0.0
        )
        self.final_k = self.k_history[-1] if self.k_history else None

    def record_verify(self, drafted: int, accepted: int) -> None:
        if drafted:
            self.num_drafts += 1
            self.drafted += drafted
            self.accepted += accepted
            self.rejected = self.drafted - self.accepted
            self.rejected_steps += accepted < drafted
            if len(self.accepted_per_pos) < drafted:
                self.accepted_per_pos.extend([0] * (drafted - len(self.accepted_per_pos)))
            for j in range(accepted):
                self.accepted_per_pos[j] += 1
