"""Five unedited `generate` samples from a decoder folder, greedy and sampled, as markdown (issue 12, item 4).

    python experiments/decoder_samples.py runs/decoder-30min/final docs/results/decoder-samples.md

Loads the folder the way a user would (AutoModelForCausalLM, AutoTokenizer), so the samples are what anyone
downloading the checkpoint gets; the model code is Kiln's own, registered with the Auto classes, never Python files
the folder names (the same code, for a folder Kiln wrote). Sampling is seeded (top-k 50, temperature 0.8): rerunning the
command rewrites the same text.
"""

import argparse
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import pretrain.modeling  # noqa: F401  (registers Kiln's classes with the Auto classes)

PROMPTS = [
    "Once upon a time",
    "Lily wanted to",
    "The little dog",
    "One day, Tom and his mom went to the park.",
    "The sun was",
]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folder")
    parser.add_argument("out")
    parser.add_argument("--max_new_tokens", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.folder, trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(args.folder, trust_remote_code=False).eval()
    lines = [
        f"# Samples from `{args.folder}`",
        "",
        f"`python experiments/decoder_samples.py {args.folder} {args.out}`: {args.max_new_tokens} new tokens, "
        "greedy, then sampled (top-k 50, temperature 0.8, seed "
        f"{args.seed}); unedited.",
        "",
    ]
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt")
        common = dict(max_new_tokens=args.max_new_tokens, pad_token_id=tokenizer.eos_token_id)
        greedy = model.generate(**ids, do_sample=False, **common)
        torch.manual_seed(args.seed)
        sampled = model.generate(**ids, do_sample=True, top_k=50, temperature=0.8, **common)
        lines += [f"**{prompt}**", ""]
        for name, out in (("greedy", greedy), ("sampled", sampled)):
            text = tokenizer.decode(out[0], skip_special_tokens=True).replace("\n", " ")
            lines += [f"- {name}: {text}"]
        lines += [""]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
