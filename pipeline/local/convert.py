"""Convert a GGUF checkpoint into a Hugging Face folder (safetensors) that vLLM loads.

Run in its own process (``python -m pipeline.local.convert GGUF OUT``) so torch and transformers never
load into the pipeline itself. Needs the ``local`` extra (transformers, gguf, accelerate, safetensors).

transformers dequantizes a GGUF into a regular model but refuses to ``save_pretrained`` it, so the
tensors, the config and the tokenizer are written here directly.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# Written by the GGUF loader, meaningless for a dequantized folder; vLLM would try to honour them.
_CONFIG_KEYS_TO_DROP = ("quantization_config", "_name_or_path", "transformers_version")


def convert(gguf_path: Path, out_dir: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    source, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=name, dtype=torch.bfloat16)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    tensors = {
        key: value.detach().to(torch.bfloat16).contiguous().clone()
        for key, value in model.state_dict().items()
        if not (tied and key == "lm_head.weight")  # tied to the embeddings; vLLM ties them again
    }
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(_config(model.config.to_dict(), tied), indent=2) + "\n")
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        values = {
            k: v for k, v in generation.to_dict().items() if v not in (None, {}, []) and not k.startswith("_")
        }
        values.pop("transformers_version", None)
        (out_dir / "generation_config.json").write_text(json.dumps(values, indent=2) + "\n")
    tokenizer.save_pretrained(str(out_dir))
    if not _has_chat_template(out_dir):
        raise RuntimeError(f"{gguf_path}: the tokenizer has no chat template; vLLM could not serve chat")


def _config(config: dict[str, Any], tied: bool) -> dict[str, Any]:
    for key in _CONFIG_KEYS_TO_DROP:
        config.pop(key, None)
    if config.get("model_type") == "llama":
        config["architectures"] = ["LlamaForCausalLM"]
    config["torch_dtype"] = config["dtype"] = "bfloat16"
    config["tie_word_embeddings"] = tied
    return config


def _has_chat_template(out_dir: Path) -> bool:
    if (out_dir / "chat_template.jinja").is_file():
        return True
    tokenizer_config = out_dir / "tokenizer_config.json"
    return tokenizer_config.is_file() and bool(json.loads(tokenizer_config.read_text()).get("chat_template"))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m pipeline.local.convert MODEL.gguf OUT_DIR")
    convert(Path(sys.argv[1]).resolve(), Path(sys.argv[2]))
