"""Forced tool calls (tool_choice "required"): tokens/s standard vs speculative, and the
grammar's time per token against a target step. Part of `python -m benchmarks constraints`
(the report's "tool_calls" section).

Chat prompts rendered by the model's chat template with TOOLS, greedy, the grammar of
`gateway.engine.constraints.tool_calls` (one call, no parallel calls), draft v2 with k in
[1, 8]. Every grammar call is timed at the Grammar protocol boundary (`TimedGrammar`). The
target step is the standard run's decode time per token (one target forward per token,
grammar included), so ``grammar_share_of_target_step`` = grammar time per token / that.
Goals: speculative >= 1.3x standard tokens/s; grammar < 5% of a target step.
"""

from __future__ import annotations

import json
import statistics
from typing import Any

from gateway.engine import DecodeRequest, Engine, LoadedModel, SamplingParams
from gateway.engine.constraints.json_schema import validate_output
from gateway.engine.constraints.tool_calls import ToolSpec, compile_tool_grammar
from gateway.serving.tool_output import read_calls

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 24},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
SEARCH = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "minLength": 1, "maxLength": 32},
        "limit": {"type": "integer", "minimum": 1, "maximum": 50},
    },
    "required": ["query"],
    "additionalProperties": False,
}
TOOLS = [ToolSpec("get_weather", WEATHER), ToolSpec("search_code", SEARCH)]
QUESTIONS = [
    "What is the weather in Paris for the next three days?",
    "Find the function that parses JSON in this repository.",
    "def load_config(path):\n    # look up where settings are read",
    "Weather in Oslo, in fahrenheit, one day.",
]


def _prompt(tok: Any, question: str) -> tuple[int, ...]:
    definitions = [
        {"type": "function", "function": {"name": t.name, "parameters": t.parameters}}
        for t in TOOLS
    ]
    text = tok.apply_chat_template(
        [{"role": "user", "content": question}],
        tools=definitions,
        tokenize=False,
        add_generation_prompt=True,
    )
    return tuple(tok(text, add_special_tokens=False)["input_ids"])


def run_tools(
    target: LoadedModel, draft: LoadedModel, grammar_type: Any, runs: int, quick: bool
) -> dict[str, Any]:
    """``grammar_type``: the benchmark's TimedGrammar(inner, mask_calls, other_calls)."""
    engine, tok = Engine(target), target.tokenizer
    prompts = [_prompt(tok, q) for q in (QUESTIONS[:2] if quick else QUESTIONS)]
    compiled = compile_tool_grammar(tok, TOOLS, "required", False, target.vocab_size)
    sp = SamplingParams(temperature=0.0, max_tokens=96)
    grammar_s: dict[str, list[float]] = {"standard": [], "speculative": []}

    def request(p: tuple[int, ...], mode: str) -> DecodeRequest:
        spec = mode == "speculative"
        grammar = grammar_type(compiled.new(), grammar_s[mode], grammar_s[mode])
        return DecodeRequest(
            p, sp, mode="speculative" if spec else "standard", proposer="draft" if spec else None,
            k_min=1, k_max=8, grammar=grammar,
        )  # fmt: skip

    for mode in grammar_s:  # warm-up
        engine.run(request(prompts[0], mode), draft=draft)
        grammar_s[mode].clear()
    seconds: dict[str, list[float]] = {m: [] for m in grammar_s}
    outputs: dict[str, list[Any]] = {m: [] for m in grammar_s}
    for _ in range(runs):
        total = dict.fromkeys(grammar_s, 0.0)
        outputs = {m: [] for m in grammar_s}
        for p in prompts:
            for mode in grammar_s:
                r = engine.run(request(p, mode), draft=draft)
                total[mode] += r.stats.draft_s + r.stats.verify_s + r.stats.other_s
                outputs[mode].append(r)
        for mode in grammar_s:
            seconds[mode].append(total[mode])

    table: dict[str, Any] = {}
    for mode, results in outputs.items():
        tokens = sum(len(r.token_ids) for r in results)
        median_s = statistics.median(seconds[mode])
        valid = 0
        for r in results:
            _, calls = read_calls(r.text)
            schemas = {t.name: t.parameters for t in TOOLS}
            if calls and all(c.complete for c in calls):
                for c in calls:
                    validate_output(c.arguments, schemas[c.name])
                valid += 1
        st = [r.stats for r in results]
        table[mode] = {
            "tokens": tokens,
            "decode_seconds_median": round(median_s, 3),
            "tokens_per_s": round(tokens / median_s, 2),
            "complete_valid_calls": f"{valid}/{len(results)}",
            "grammar_us_per_token": round(sum(grammar_s[mode]) / max(tokens * runs, 1) * 1e6, 1),
        }
        if sum(s.drafted for s in st):
            table[mode]["acceptance_rate"] = round(
                sum(s.accepted for s in st) / sum(s.drafted for s in st), 4
            )
    step_us = 1e6 / table["standard"]["tokens_per_s"]
    speedup = table["speculative"]["tokens_per_s"] / table["standard"]["tokens_per_s"]
    share = table["standard"]["grammar_us_per_token"] / step_us
    same = all(
        a.token_ids == b.token_ids
        for a, b in zip(outputs["standard"], outputs["speculative"], strict=True)
    )
    return {
        "tools": [t.name for t in TOOLS],
        "prompts": len(prompts),
        "configs": table,
        "example_output": json.loads(json.dumps(outputs["standard"][0].text)),
        "speculative_equals_standard": same,
        "target_step_us": round(step_us, 1),
        "grammar_share_of_target_step": round(share, 4),
        "goals": {
            "speculative_over_standard": round(speedup, 3),
            "met": speedup >= 1.3 and share < 0.05,
            "targets": "speculative >= 1.3x standard tokens/s; grammar < 5% of a target step",
        },
    }
