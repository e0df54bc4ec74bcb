"""SGLang's speculative acceptance from its own Prometheus counters (verify calls and
generated tokens of finished requests), as the sglang preset names them; the text is
what sglang 0.5.23's metrics_collector exports (labels as it sets them)."""

from __future__ import annotations

from servesweep.bench.specdecode import acceptance_from_counters, counter_names, parse_counters
from servesweep.servers.engines import get_preset

SGLANG = get_preset("sglang").spec_decode_counters


def _metrics(tokens_stream: float, tokens_plain: float, verify: float) -> str:
    labels = 'model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"'
    return "\n".join(
        [
            "# HELP sglang:generation_tokens_total Number of generation tokens processed.",
            "# TYPE sglang:generation_tokens_total counter",
            f'sglang:generation_tokens_total{{{labels},is_streaming="true"}} {tokens_stream}',
            f'sglang:generation_tokens_total{{{labels},is_streaming="false"}} {tokens_plain}',
            "# TYPE sglang:spec_verify_calls_total counter",
            f"sglang:spec_verify_calls_total{{{labels}}} {verify}",
            f"sglang:spec_accept_length{{{labels}}} 9.5",
        ]
    )


def test_sglang_acceptance_comes_from_its_counters() -> None:
    names = counter_names(SGLANG)
    assert set(names) == {"sglang:spec_verify_calls_total", "sglang:generation_tokens_total"}
    before = parse_counters(_metrics(1000, 200, 400), names)
    after = parse_counters(_metrics(1000 + 2560, 200 + 640, 400 + 1000), names)
    length, detail = acceptance_from_counters(SGLANG, before, after)
    assert length == 3.2  # 3200 tokens over 1000 verify calls, both label sets summed
    assert detail["source"] == "engine_counters"
    assert (detail["drafts"], detail["emitted_tokens"]) == (1000, 3200)


def test_sglang_without_speculative_decoding_has_no_acceptance() -> None:
    names = counter_names(SGLANG)
    before = parse_counters(_metrics(100, 0, 0), names)
    after = parse_counters(_metrics(900, 0, 0), names)  # no verify call during the level
    length, _ = acceptance_from_counters(SGLANG, before, after)
    assert length is None
