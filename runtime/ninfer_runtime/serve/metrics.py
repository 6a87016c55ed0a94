"""Prometheus metrics of one server (its own registry, so several servers can live in one process).

Names and meaning (README "Serving"):
- ninfer_requests_total{endpoint, outcome}: finished requests by outcome (stop, length, abort,
  cancelled, error) and HTTP rejections (400, 401, 404, 429, 503);
- ninfer_prompt_tokens_total, ninfer_generation_tokens_total, ninfer_cached_prompt_tokens_total:
  prompt tokens of admitted requests, generated tokens, prompt tokens restored from the prefix cache;
- ninfer_time_to_first_token_seconds, ninfer_time_per_output_token_seconds, ninfer_queue_wait_seconds,
  ninfer_request_latency_seconds: server-side histograms (arrival -> first token; mean gap between
  later tokens of a request; arrival -> admission into a slot; arrival -> last token);
- ninfer_queue_depth, ninfer_running_requests, ninfer_slots_used, ninfer_slots_total: gauges;
- ninfer_spec_rounds_total, ninfer_spec_draft_tokens_total, ninfer_spec_accepted_tokens_total: speculative
  decoding (a plan with draft extents, `--spec mtp|ngram`): verify rounds summed over the sequences in them,
  draft tokens proposed, drafts accepted; acceptance = accepted / draft tokens, tokens per round =
  (accepted + rounds) / rounds (each round also emits the target's own token); ninfer_spec_info{mode, k}
  = 1 names the drafter and the draft window (mode "none", k 0 without speculation);
- ninfer_prefix_cache_bytes{tier}, ninfer_prefix_cache_snapshots, ninfer_prefix_cache_hits_total,
  ninfer_prefix_cache_lookups_total, ninfer_prefix_cache_evictions_total.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

_LAT = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_TOK = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, slots: int, spec_mode: str = "none", draft_tokens: int = 0):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("ninfer_requests", "Requests by endpoint and outcome", ["endpoint", "outcome"],
                                registry=r)
        self.prompt_tokens = Counter("ninfer_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter("ninfer_generation_tokens", "Generated tokens", registry=r)
        self.cached_tokens = Counter("ninfer_cached_prompt_tokens", "Prompt tokens restored from the prefix cache",
                                     registry=r)
        self.ttft = Histogram("ninfer_time_to_first_token_seconds", "Arrival to first token (server side)",
                              buckets=_LAT, registry=r)
        self.tpot = Histogram("ninfer_time_per_output_token_seconds", "Mean time between a request's later tokens",
                              buckets=_TOK, registry=r)
        self.queue_wait = Histogram("ninfer_queue_wait_seconds", "Arrival to admission into a slot", buckets=_LAT,
                                    registry=r)
        self.latency = Histogram("ninfer_request_latency_seconds", "Arrival to last token", buckets=_LAT, registry=r)
        self.queue_depth = Gauge("ninfer_queue_depth", "Requests waiting for a slot", registry=r)
        self.running = Gauge("ninfer_running_requests", "Requests holding a slot (prefill or decode)", registry=r)
        self.slots_used = Gauge("ninfer_slots_used", "State slots in use", registry=r)
        self.slots_total = Gauge("ninfer_slots_total", "State slots (the plan's largest concurrency)", registry=r)
        self.slots_total.set(slots)
        self.cache_bytes = Gauge("ninfer_prefix_cache_bytes", "Prefix-cache snapshot bytes", ["tier"], registry=r)
        self.cache_snapshots = Gauge("ninfer_prefix_cache_snapshots", "Prefix-cache snapshots held", registry=r)
        self.cache_hits = Counter("ninfer_prefix_cache_hits", "Lookups that restored a snapshot", registry=r)
        self.cache_lookups = Counter("ninfer_prefix_cache_lookups", "Prefix-cache lookups", registry=r)
        self.cache_evictions = Counter("ninfer_prefix_cache_evictions", "Snapshots evicted from the device tier",
                                       registry=r)
        self.spec_rounds = Counter("ninfer_spec_rounds", "Speculative rounds, summed over the sequences in them",
                                   registry=r)
        self.spec_proposed = Counter("ninfer_spec_draft_tokens", "Draft tokens proposed to verification", registry=r)
        self.spec_accepted = Counter("ninfer_spec_accepted_tokens", "Draft tokens accepted by verification",
                                     registry=r)
        self.spec_info = Gauge("ninfer_spec_info", "The speculative drafter and draft window", ["mode", "k"],
                               registry=r)
        self.spec_info.labels(spec_mode, str(int(draft_tokens))).set(1)
        self._cache_seen = {"hits": 0, "lookups": 0, "evictions": 0}

    def cache(self, stats: dict[str, int]) -> None:
        self.cache_bytes.labels("device").set(stats["device_bytes"])
        self.cache_bytes.labels("host").set(stats["host_bytes"])
        self.cache_snapshots.set(stats["snapshots"])
        for key, c in (("hits", self.cache_hits), ("lookups", self.cache_lookups),
                       ("evictions", self.cache_evictions)):
            d = stats[key] - self._cache_seen[key]
            if d > 0:
                c.inc(d)
                self._cache_seen[key] = stats[key]

    def render(self) -> bytes:
        return generate_latest(self.registry)
