"""Build a tiny random-weight Llama-style model in Hugging Face format, offline: a byte-level BPE tokenizer
trained with `tokenizers` on generated text, a ~16M-parameter config and safetensors weights.

    python -m nereid.backends.llm.tiny_model FOLDER

It contacts no model hub; tests, examples and benchmarks use it. It must not be imported by the server.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["build_tiny_model", "cached_tiny_model", "write_vllm_model", "CHAT_TEMPLATE"]

# A plain chat format: each turn is "<|role|>\n{content}</s>\n"; the generation prompt opens the assistant turn.
# With tools it is Hermes-style (as Qwen and NousResearch's Hermes models): a system turn lists the functions
# inside <tools></tools>, the assistant calls them as <tool_call>{"name": ..., "arguments": {...}}</tool_call>,
# and a tool's answer is a turn of its own. Without tools the prompt is exactly the plain format.
CHAT_TEMPLATE = (
    "{% if tools %}"
    "{{ '<|system|>\\nYou may call these functions:\\n<tools>\\n' }}"
    "{% for tool in tools %}{{ tool | tojson }}{{ '\\n' }}{% endfor %}"
    "{{ '</tools>\\nCall one as <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>' + eos_token + '\\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] %}"
    "{{ '<|assistant|>\\n' + (message['content'] or '') }}"
    "{% for call in message['tool_calls'] %}"
    "{{ '<tool_call>' + ({'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson) + '</tool_call>' }}"
    "{% endfor %}"
    "{{ eos_token + '\\n' }}"
    "{% elif message['role'] == 'tool' %}"
    "{{ '<|tool|>\\n<tool_response>' + message['content'] + '</tool_response>' + eos_token + '\\n' }}"
    "{% else %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

_SPECIAL = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
_CONSONANTS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiou"


def _corpus(seed: int, sentences: int = 6000) -> list[str]:
    """Sentences over a generated vocabulary, with digits and punctuation, so BPE learns real merges."""
    rng = random.Random(seed)
    words = sorted(
        {
            "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(rng.randint(1, 4)))
            for _ in range(1500)
        }
    )
    common = ["the", "a", "of", "and", "to", "in", "is", "it", "you", "that", "what", "how", "server", "model"]
    lines = []
    for _ in range(sentences):
        n = rng.randint(4, 16)
        parts = [rng.choice(common) if rng.random() < 0.3 else rng.choice(words) for _ in range(n)]
        if rng.random() < 0.2:
            parts.append(str(rng.randint(0, 9999)))
        sentence = " ".join(parts)
        lines.append(sentence[0].upper() + sentence[1:] + rng.choice([".", "?", "!", ","]))
    return lines


def _train_tokenizer(vocab_size: int, seed: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=_SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(seed), trainer=trainer)
    bos = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    return tokenizer


def build_tiny_model(
    folder: Path | str,
    *,
    seed: int = 0,
    vocab_size: int = 2048,
    hidden_size: int = 384,
    layers: int = 8,
    heads: int = 6,
    kv_heads: int = 2,
    intermediate_size: int = 1024,
    max_position_embeddings: int = 2048,
    initializer_range: float = 0.05,
) -> Path:
    """Write config.json, model.safetensors, generation_config.json and the tokenizer files into `folder`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    raw = _train_tokenizer(vocab_size, seed)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.model_max_length = max_position_embeddings
    tokenizer.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=raw.get_vocab_size(),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        initializer_range=initializer_range,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


# Bump when the builder's output changes, so cached copies are rebuilt.
_BUILD_VERSION = 1


def cached_tiny_model(cache_dir: Path | str | None = None) -> Path:
    """The default tiny model, built once per machine (under the temp folder) and reused; safe when several
    processes ask at once (each builds aside and the first rename wins)."""
    base = Path(cache_dir) if cache_dir is not None else Path(tempfile.gettempdir())
    target = base / f"nereid-tiny-llm-v{_BUILD_VERSION}"
    if (target / "model.safetensors").is_file():
        return target
    base.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tiny-llm-", dir=base))
    build_tiny_model(staging)
    try:
        os.rename(staging, target)
    except OSError:  # another process got there first
        shutil.rmtree(staging, ignore_errors=True)
    return target


def write_vllm_model(repository: Path | str, name: str, engine_args: dict[str, Any] | None = None, **build: Any) -> Path:
    """A Triton vLLM-backend model folder: config.pbtxt, 1/model.json and the model files in 1/
    (`cached=True` copies the default model built by `cached_tiny_model` instead of building one)."""
    model_dir = Path(repository) / name
    version = model_dir / "1"
    if build.pop("cached", False):
        shutil.copytree(cached_tiny_model(), version, dirs_exist_ok=True)
        _write_chat_template(version)
    else:
        build_tiny_model(version, **build)
    args = {"model": ".", "max_num_seqs": 64, "max_model_len": 1024}
    args.update(engine_args or {})
    (version / "model.json").write_text(json.dumps(args, indent=2) + "\n")
    (model_dir / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "vllm"\n\ninstance_group [\n  {{\n    count: 1\n    kind: KIND_MODEL\n  }}\n]\n'
    )
    return model_dir


def _write_chat_template(folder: Path) -> None:
    """The current chat template over a copy of a cached build (older builds carry the template without tools)."""
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)


def main(argv: list[str] | None = None) -> int:
    """Fill FOLDER with the tiny model's files (kept when they are already there: `make models` runs often)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m nereid.backends.llm.tiny_model FOLDER\n")
        return 2
    folder = Path(args[0])
    if not (folder / "model.safetensors").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        source = cached_tiny_model()
        for item in source.iterdir():
            shutil.copy2(item, folder / item.name)
    _write_chat_template(folder)
    print(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
