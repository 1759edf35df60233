"""Writes a tiny Hugging Face model directory (real architecture, seeded random weights, local tokenizer).

Example: python tools/make_tiny_model.py --family qwen2 --out /tmp/tiny-qwen2
         python tools/make_tiny_model.py --family llama --rope llama3 --out /tmp/tiny-llama3.1
"""

import argparse

from distflow.models.tiny import DEFAULT_SIZES, FAMILIES, ROPE_VARIANTS, make_tiny_model


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", required=True, choices=sorted(FAMILIES))
    parser.add_argument("--out", required=True, help="output directory (created if missing)")
    parser.add_argument(
        "--rope",
        choices=sorted(ROPE_VARIANTS),
        default="default",
        help="rope settings; llama3: Llama 3.1's rope scaling (factor 8 from 8K positions)",
    )
    parser.add_argument(
        "--tool-calls",
        action="store_true",
        help="train the tokenizer on Hermes tool calls too (multi-turn tool tasks: a ~20-token call)",
    )
    for name, default in DEFAULT_SIZES.items():
        kind = str if name == "dtype" else int
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, default=default)
    args = vars(parser.parse_args(argv))
    family, out = args.pop("family"), args.pop("out")
    print(make_tiny_model(family, out, **args))


if __name__ == "__main__":
    main()
