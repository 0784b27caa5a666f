"""Write the tiny random Llama every producer quantizes (run inside a producer's venv, which
provides transformers and tokenizers): hidden 256, intermediate 512, 2 layers, vocab 1024, bf16,
seed 0, with a WordLevel tokenizer over t0..t1023 so calibration pipelines accept the directory.

    python base_model.py OUT_DIR [--dtype bfloat16|float16]
"""
from __future__ import annotations

import argparse

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    args = parser.parse_args()
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=1024, max_position_embeddings=256,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).to(getattr(torch, args.dtype))
    model.save_pretrained(args.out)
    vocab = {f"t{i}": i for i in range(1024)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", pad_token="t0", eos_token="t1", bos_token="t2")
    fast.save_pretrained(args.out)


if __name__ == "__main__":
    main()
