"""Writes train/test parquet files in the common RL schema (prompt, data_source, reward_model, extra_info).

Examples:
  python tools/prepare_data.py gsm_symbolic --out data/gsm --train 7000 --test 500 --seed 1   # offline GSM8K-style
  python tools/prepare_data.py gsm8k --input gsm8k/train.jsonl --out data/gsm8k   # your GSM8K copy (or a saved dir)
  python tools/prepare_data.py math --input math_test.jsonl --out data/math       # MATH: problem, solution/answer
  python tools/prepare_data.py copy --out data/copy --digits 4 --train 9000 --test 200 --seed 1   # the toy task
"""

import argparse

from distflow.data import preparation


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    modes = parser.add_subparsers(dest="mode", required=True)
    sym = modes.add_parser("gsm_symbolic", help="GSM8K-style problems generated offline by reasoning-gym")
    sym.add_argument("--difficulty", type=float, default=1.0, help="reasoning-gym gsm_symbolic difficulty")
    copy = modes.add_parser("copy", help="the toy copy task (data_source distflow/copy)")
    copy.add_argument("--digits", type=int, default=4)
    copy.add_argument(
        "--min-digits",
        type=int,
        default=None,
        help="each string's length uniform in [min-digits, digits] (default: all of --digits)",
    )
    lookup = modes.add_parser(
        "lookup", help="the toy task that needs the lookup tool (data_source distflow/lookup)"
    )
    lookup.add_argument("--digits", type=int, default=3, help="digits of each value")
    lookup.add_argument("--keys", type=int, default=10, help="keys 0..keys-1 named by the prompts")
    for generated in (sym, copy, lookup):
        generated.add_argument("--train", type=int, required=True, help="training rows")
        generated.add_argument("--test", type=int, required=True, help="test rows (never in train)")
        generated.add_argument("--seed", type=int, default=1)
    for name, default_source in (("gsm8k", preparation.GSM8K_SOURCE), ("math", preparation.MATH_SOURCE)):
        from_file = modes.add_parser(
            name, help=f"{name} records from a jsonl file or a datasets.save_to_disk dir"
        )
        from_file.add_argument("--input", required=True)
        from_file.add_argument("--split", help="split name of a jsonl input (default: from the file name)")
        from_file.add_argument(
            "--data-source", default=default_source, help="data_source written in each row"
        )
    for mode in modes.choices.values():
        mode.add_argument("--out", required=True, help="output directory: <split>.parquet files")
    args = parser.parse_args(argv)

    if args.mode == "gsm_symbolic":
        rows = preparation.gsm_symbolic_rows(args.train, args.test, args.seed, args.difficulty)
    elif args.mode == "copy":
        rows = preparation.copy_rows(args.digits, args.train, args.test, args.seed, args.min_digits)
    elif args.mode == "lookup":
        rows = preparation.lookup_rows(args.train, args.test, args.seed, args.digits, args.keys)
    else:
        to_rows = preparation.gsm8k_rows if args.mode == "gsm8k" else preparation.math_rows
        records = preparation.read_records(args.input)
        if args.split and len(records) == 1:
            records = {args.split: next(iter(records.values()))}
        rows = {split: to_rows(recs, split, args.data_source) for split, recs in records.items()}
    paths = preparation.write_splits(rows, args.out)
    for split, path in paths.items():
        print(f"{split}: {len(rows[split])} rows -> {path}")
    return paths


if __name__ == "__main__":
    main()
