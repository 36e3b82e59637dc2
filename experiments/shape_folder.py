"""A randomly initialised model folder with the shape and tokenizer of a pretraining run that is still training:
what `--model.from_scratch` needs (config.json + tokenizer; the weights are never read), so the scratch baselines
can be fine-tuned before the run's final/ exists. Compare its config.json and tokenizer with final/ afterwards
(experiments/shape_folder.py --check).

    python experiments/shape_folder.py runs/encoder-30min runs/encoder-30min-shape
    python experiments/shape_folder.py runs/encoder-30min runs/encoder-30min-shape --check
"""

import argparse
import json
import sys
from pathlib import Path

SHAPE_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
    "hidden_act",
    "layer_norm_eps",
    "pad_token_id",
    "position_embedding_type",
    "model_type",
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run")
    parser.add_argument("out")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    run, out = Path(args.run), Path(args.out)
    if args.check:
        final = json.loads((run / "final" / "config.json").read_text())
        shape = json.loads((out / "config.json").read_text())
        diff = {k: (final.get(k), shape.get(k)) for k in SHAPE_KEYS if final.get(k) != shape.get(k)}
        same_tok = (run / "final" / "tokenizer.json").read_bytes() == (out / "tokenizer.json").read_bytes()
        print(json.dumps({"config_differences": diff, "tokenizer_identical": same_tok}))
        sys.exit(0 if not diff and same_tok else 1)
    import yaml
    from transformers import AutoTokenizer

    from kiln.config import config_from_dict
    from pretrain.config import RunConfig
    from pretrain.data import padded_vocab_size
    from pretrain.run import build_model

    config = config_from_dict(RunConfig, yaml.safe_load((run / "config.yaml").read_text()))
    tokenizer = AutoTokenizer.from_pretrained(run / "tokenizer", trust_remote_code=False)
    model = build_model(
        config, tokenizer, padded_vocab_size(tokenizer, config.tokenizer.pad_vocab_to_multiple_of)
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
