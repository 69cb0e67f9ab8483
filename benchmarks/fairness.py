"""A hog tenant beside a victim tenant: does the victim keep its latency, does the gateway
keep answering, and does the hog still get the capacity nobody else uses?

    python -m benchmarks fairness [--quick]

Two gateway processes on the demo models, default settings and default tenant policies
(`fairness` in policies/bundles/default.yaml), the second without preemption (the control).
Seven phases of 60 s each (--quick: 30), every phase run in ROUNDS parts, one a round, the
phases interleaved, so that load from elsewhere on a shared machine hits them alike:

1. victim alone: VICTIM_CLIENTS clients, each sending ordinary requests one after another
   (chat, max_tokens 64, temperature 0);
2. hog alone: HOG_CLIENTS clients, each streaming n = 8, max_tokens 1800 requests, a new one
   as soon as one ends or is refused (as many as the hog's limits allow);
3. both at once;
4. an ordinary victim alone: requests arriving at random (Poisson) at OPEN_LOAD of the rate
   it completed in phase 1's first part, each sent on arrival: a tenant asking for less
   than its fair share. (The clients of phase 1 send their next request the moment one ends, so that
   victim alone takes the whole worker; beside a backlogged tenant of equal weight its
   fair share is half of it, about twice its latency alone at best. At half its alone rate
   the open-loop victim would ask for all of its share, and its queue would grow.);
5. that victim beside the hog;
6. phase 5 again on the second gateway (`GATEWAY_PREEMPT=false`), the hog capped at 6 of
   the 8 rows (`max_rows: 6`): the gateway's fair sharing before preemption, side by side;
7. the hog alone on that second gateway: what a row cap costs a tenant that is alone.

Throughout, /health is polled every 50 ms. Goals (issue 44): victim 100% success and p95
latency <= 2x its p95 alone (each victim: phase 3 against 1, 5 against 4); /health p99 <
100 ms; aggregate tokens/s with the victim within 10% of the hog alone (the hog keeps the
capacity nobody else uses), judged beside the open-loop victim (phase 5 against 2): the
closed-loop victim leaves no capacity unused, it takes its whole share (its ratio, phase 3
against 2, is reported too). Writes fairness.json and fairness.png.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks._server import Running, gateway

MODEL = "demo-code-target"
VICTIM_CLIENTS = 2
HOG_CLIENTS = 6
HOG_N = 8
HOG_MAX_TOKENS = 1800
VICTIM_MAX_TOKENS = 64
OPEN_LOAD = 0.3  # the open-loop victim's rate: this share of what it completed alone
ROUNDS = 4  # each phase runs in this many parts, one a round, the phases interleaved
CAPPED: dict[str, object] = {"fairness": {"max_rows": 6}}  # the control: the old default cap
PROMPTS = [
    "def fibonacci(n):",
    "class Stack:\n    def __init__(self):",
    "import os\n\ndef walk(path):",
    "def parse_args(argv):",
]


def _p(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


class Phase:
    """What one phase saw: victim latencies and outcomes, tokens over time, health probes."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.t0 = time.perf_counter()
        self.victim: list[tuple[float, float, int]] = []  # (start, seconds, status)
        self.tokens: list[tuple[float, str, int]] = []  # (time, tenant, tokens)
        self.health: list[tuple[float, float]] = []  # (time, seconds)
        self.hog_refused = 0
        self.hog_requests = 0

    def completed(self) -> int:
        return sum(1 for *_, status in self.victim if status == 200)

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def summary(self, duration: float) -> dict[str, Any]:
        lat = [s for _, s, status in self.victim if status == 200]
        ok = sum(1 for *_, status in self.victim if status == 200)
        total = {t: sum(n for _, who, n in self.tokens if who == t) for t in ("hog", "victim")}
        return {
            "victim_requests": len(self.victim),
            "victim_success": ok / len(self.victim) if self.victim else None,
            "victim_statuses": sorted({status for *_, status in self.victim}),
            "victim_p50_s": _p(lat, 0.5),
            "victim_p95_s": _p(lat, 0.95),
            "hog_requests_started": self.hog_requests,
            "hog_refused": self.hog_refused,
            "tokens_per_s": {t: n / duration for t, n in total.items()},
            "aggregate_tokens_per_s": sum(total.values()) / duration,
            "health_probes": len(self.health),
            "health_p50_ms": 1000 * (_p([s for _, s in self.health], 0.5) or 0),
            "health_p99_ms": 1000 * (_p([s for _, s in self.health], 0.99) or 0),
            "health_max_ms": 1000 * max((s for _, s in self.health), default=0),
        }


async def _victim(client: httpx.AsyncClient, key: str, phase: Phase, stop: float, i: int):
    """One closed-loop client: its next request the moment one ends."""
    k = i
    while phase.now() < stop:
        await _one_victim(client, key, phase, k)
        k += VICTIM_CLIENTS


async def _victim_open(
    client: httpx.AsyncClient, key: str, phase: Phase, stop: float, rate: float
) -> None:
    """Requests arriving at random (Poisson, ``rate`` a second, a fixed seed: the same
    arrivals in every phase), each sent when it arrives whether or not the last has ended."""
    arrivals = random.Random(7)
    sent: list[asyncio.Task[None]] = []
    k, at = 0, 0.0
    while True:
        at += arrivals.expovariate(rate)
        if at >= stop:
            break
        await asyncio.sleep(max(0.0, at - phase.now()))
        sent.append(asyncio.create_task(_one_victim(client, key, phase, k)))
        k += 1
    await asyncio.gather(*sent)


async def _one_victim(client: httpx.AsyncClient, key: str, phase: Phase, k: int) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPTS[k % len(PROMPTS)]}],
        "max_tokens": VICTIM_MAX_TOKENS,
        "temperature": 0,
    }
    start = phase.now()
    t = time.perf_counter()
    try:
        r = await client.post(
            "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
        )
        status = r.status_code
        if status == 200:
            phase.tokens.append((phase.now(), "victim", r.json()["usage"]["completion_tokens"]))
    except httpx.HTTPError:
        status = 0
    phase.victim.append((start, time.perf_counter() - t, status))


async def _hog(client: httpx.AsyncClient, key: str, phase: Phase, stop: float, i: int):
    k = i
    while phase.now() < stop:
        body = {
            "model": MODEL,
            "prompt": PROMPTS[k % len(PROMPTS)],
            "max_tokens": HOG_MAX_TOKENS,
            "n": HOG_N,
            "temperature": 0.8,
            "stream": True,
            "logprobs": 0,  # each chunk lists its tokens: counted as they arrive
        }
        k += 1
        try:
            async with client.stream(
                "POST", "/v1/completions", json=body,
                headers={"authorization": f"Bearer {key}"},
            ) as r:  # fmt: skip
                if r.status_code != 200:
                    phase.hog_refused += 1
                    await r.aread()
                    await asyncio.sleep(0.2)
                    continue
                phase.hog_requests += 1
                async for line in r.aiter_lines():
                    if phase.now() >= stop:
                        break  # the client goes: the gateway cancels its rows
                    if line.startswith("data: {"):
                        chunk = json.loads(line[6:])
                        n = sum(
                            len((c.get("logprobs") or {}).get("tokens") or ())
                            for c in chunk.get("choices", ())
                        )
                        if n:
                            phase.tokens.append((phase.now(), "hog", n))
        except httpx.HTTPError:
            phase.hog_refused += 1
            await asyncio.sleep(0.2)


async def _health(client: httpx.AsyncClient, phase: Phase, stop: float) -> None:
    while phase.now() < stop:
        t = time.perf_counter()
        with contextlib.suppress(httpx.HTTPError):
            await client.get("/health", timeout=10)
        phase.health.append((phase.now(), time.perf_counter() - t))
        await asyncio.sleep(0.05)


async def _phase(
    server: Running, name: str, victim: str | None, hog: str | None, seconds: float,
    open_rate: float | None = None,
) -> Phase:  # fmt: skip
    phase = Phase(name)
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with (
        httpx.AsyncClient(base_url=server.url, timeout=600, limits=limits) as client,
        httpx.AsyncClient(base_url=server.url, timeout=10) as probe,
    ):
        tasks = [asyncio.create_task(_health(probe, phase, seconds))]
        if victim and open_rate:
            tasks.append(
                asyncio.create_task(_victim_open(client, victim, phase, seconds, open_rate))
            )
        elif victim:
            tasks += [
                asyncio.create_task(_victim(client, victim, phase, seconds, i))
                for i in range(VICTIM_CLIENTS)
            ]
        if hog:
            tasks += [
                asyncio.create_task(_hog(client, hog, phase, seconds, i))
                for i in range(HOG_CLIENTS)
            ]
        await asyncio.gather(*tasks)
    await asyncio.sleep(2)  # the abandoned hog rows end at their next step
    return phase


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _merge(into: Phase | None, part: Phase, offset: float) -> Phase:
    """A round's part of a phase added to the phase so far, its times shifted by `offset`."""
    if into is None:
        return part
    into.victim += [(t + offset, d, st) for t, d, st in part.victim]
    into.tokens += [(t + offset, who, n) for t, who, n in part.tokens]
    into.health += [(t + offset, d) for t, d in part.health]
    into.hog_refused += part.hog_refused
    into.hog_requests += part.hog_requests
    return into


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    seconds = 30.0 if quick else 60.0
    rounds = 2 if quick else ROUNDS
    part = seconds / rounds
    phases: dict[str, Phase] = {}
    with gateway() as server, gateway(GATEWAY_PREEMPT="false") as control:
        victim, hog = server.tenant("victim"), server.tenant("hog")
        c_victim, c_hog = control.tenant("victim"), control.tenant("hog", CAPPED)
        # Warm the paths both tenants take (the first requests load and compile).
        asyncio.run(_phase(server, "warm", victim, hog, 8.0))
        asyncio.run(_phase(control, "warm", c_victim, c_hog, 8.0))
        rate = 0.0
        for r in range(rounds):  # every phase a part of each round: load hits them alike
            runs: dict[str, tuple[Running, str | None, str | None]] = {
                "victim_alone": (server, victim, None),
                "hog_alone": (server, None, hog),
                "both": (server, victim, hog),
                "open_victim_alone": (server, victim, None),
                "open_both": (server, victim, hog),
                "open_both_capped_no_preemption": (control, c_victim, c_hog),
                "hog_alone_capped_no_preemption": (control, None, c_hog),
            }
            for name, (srv, v, h) in runs.items():
                if name.startswith("open") and not rate:
                    # An ordinary victim: requests arriving at random at OPEN_LOAD of the
                    # rate the victim alone completed in the first round (less than its
                    # share of the worker).
                    rate = OPEN_LOAD * phases["victim_alone"].completed() / part
                open_rate = rate if name.startswith("open") else None
                got = asyncio.run(_phase(srv, name, v, h, part, open_rate))
                phases[name] = _merge(phases.get(name), got, r * part)
    summary = {name: p.summary(seconds) for name, p in phases.items()}
    alone, both, hog_alone = summary["victim_alone"], summary["both"], summary["hog_alone"]
    health = max(s["health_p99_ms"] for s in summary.values())
    ratio_p95 = (
        both["victim_p95_s"] / alone["victim_p95_s"]
        if both["victim_p95_s"] and alone["victim_p95_s"]
        else None
    )
    ratio_tps = both["aggregate_tokens_per_s"] / max(hog_alone["aggregate_tokens_per_s"], 1e-9)
    open_tps = summary["open_both"]["aggregate_tokens_per_s"] / max(
        hog_alone["aggregate_tokens_per_s"], 1e-9
    )
    o_alone, o_both = summary["open_victim_alone"], summary["open_both"]
    open_p95 = _ratio(o_both["victim_p95_s"], o_alone["victim_p95_s"])
    capped = summary["open_both_capped_no_preemption"]
    goals = {
        "victim_success_100pct": both["victim_success"] == 1.0 and o_both["victim_success"] == 1.0,
        "victim_p95_within_2x_alone": ratio_p95 is not None and ratio_p95 <= 2.0,
        "open_victim_p95_within_2x_alone": open_p95 is not None and open_p95 <= 2.0,
        "health_p99_under_100ms": health < 100.0,
        "aggregate_within_10pct_of_hog_alone": open_tps >= 0.9,
    }
    result = {
        "settings": {
            "phase_s": seconds,
            "rounds": rounds,
            "victim_clients": VICTIM_CLIENTS,
            "victim_max_tokens": VICTIM_MAX_TOKENS,
            "hog_clients": HOG_CLIENTS,
            "hog_n": HOG_N,
            "hog_max_tokens": HOG_MAX_TOKENS,
            "policies": "default (fairness: weight 1, caps from policies/bundles/default.yaml)",
        },
        "phases": summary,
        "victim_p95_ratio": ratio_p95,
        "open_victim_rate_per_s": rate,
        "open_victim_p95_ratio": open_p95,
        "aggregate_ratio_to_hog_alone": ratio_tps,
        "open_aggregate_ratio_to_hog_alone": open_tps,
        "control_open_victim_p95_ratio": _ratio(capped["victim_p95_s"], o_alone["victim_p95_s"]),
        "hog_alone_capped_over_whole_batch": summary["hog_alone_capped_no_preemption"][
            "aggregate_tokens_per_s"
        ]
        / max(hog_alone["aggregate_tokens_per_s"], 1e-9),
        "health_p99_ms_worst_phase": health,
        "goals": goals,
    }
    _plot(out_dir / "fairness.png", phases)
    return result


def table(result: dict[str, Any]) -> str:
    head = "victim ok  victim p95 s  hog refused  tokens/s  /health p99 ms"
    rows = [f"   {'phase':<30} {head}"]
    for name, s in result["phases"].items():
        ok = "-" if s["victim_success"] is None else f"{s['victim_success']:.0%}"
        p95 = "-" if s["victim_p95_s"] is None else f"{s['victim_p95_s']:.2f}"
        rows.append(
            f"   {name:<30} {ok:>9}  {p95:>12}  {s['hog_refused']:>11}"
            f"  {s['aggregate_tokens_per_s']:>8.1f}  {s['health_p99_ms']:>14.1f}"
        )
    rows.append(f"   victim p95 both/alone: {result['victim_p95_ratio']}")
    rows.append(f"   open-loop victim p95 both/alone: {result['open_victim_p95_ratio']}")
    rows.append(
        "   aggregate / hog alone: open-loop victim "
        f"{result['open_aggregate_ratio_to_hog_alone']:.3f}"
        f", closed-loop {result['aggregate_ratio_to_hog_alone']:.3f}"
    )
    rows.append(
        "   control (row cap, no preemption), open-loop victim p95 / alone: "
        f"{result['control_open_victim_p95_ratio']}"
    )
    rows.append(
        "   hog alone, capped at 6 rows / whole batch: "
        f"{result['hog_alone_capped_over_whole_batch']:.3f}"
    )
    rows.append(f"   goals: {json.dumps(result['goals'])}")
    return "\n".join(rows)


def _plot(path: Path, phases: dict[str, Phase]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    for name, p in phases.items():
        if p.victim:
            axes[0].plot(
                [s for s, _, st in p.victim if st == 200],
                [d for _, d, st in p.victim if st == 200],
                ".", label=f"victim ({name})",
            )  # fmt: skip
        buckets: dict[int, int] = {}
        for t, _, n in p.tokens:
            buckets[int(t)] = buckets.get(int(t), 0) + n
        xs = sorted(buckets)
        axes[1].plot(xs, [buckets[x] for x in xs], label=name)
        axes[2].plot([t for t, _ in p.health], [1000 * s for _, s in p.health], label=name)
    axes[0].set_ylabel("victim latency (s)")
    axes[1].set_ylabel("tokens/s (all tenants)")
    axes[2].set_ylabel("/health (ms)")
    axes[2].set_xlabel("seconds into the phase")
    for ax in axes:
        ax.legend(fontsize=8)
    fig.suptitle("A hog tenant beside a victim tenant (benchmarks/fairness.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    r = run(Path(__file__).resolve().parent / "reports", quick=True)
    print(table(r))
