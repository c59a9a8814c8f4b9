"""The importer's command line: FILE... -> --out STUDY.yaml; a refused import is one line on stderr, exit code 2.

python3 -m workflow_scripts.importers sft.yaml ds_z2.json ds_z3.json --world-size 4 --out studies/mine.yaml
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from workflow_scripts.importers import ImportRefused, import_files, text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m workflow_scripts.importers",
        description="Write one study from LLaMA-Factory train YAMLs, DeepSpeed JSONs, accelerate config YAMLs and "
        "torchtitan TOMLs (docs/importing.md).",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="the files to import, in any combination")
    parser.add_argument("--out", required=True, help="the study YAML to write")
    parser.add_argument("--study", help="the study's name (default: the --out file's name)")
    parser.add_argument("--world-size", type=int, help="ranks per run, where no file says it")
    parser.add_argument("--platform", choices=("cpu", "cuda", "rocm"), help="default: the files', else cuda")
    parser.add_argument("--strict", action="store_true", help="refuse the import instead of any substitution")
    parser.add_argument("--no-check", action="store_true", help="write without running the study's config check")
    args = parser.parse_args(argv)
    # DeepSpeed is imported only to check the options against its config models; its accelerator notice at import
    # would be a second line beside a refusal's one
    logging.getLogger("DeepSpeed").disabled = True
    name = args.study or os.path.splitext(os.path.basename(args.out))[0]
    if args.world_size is not None and args.world_size < 1:
        parser.error("--world-size must be positive")
    try:
        config, ledger = import_files(
            args.files,
            name,
            world=args.world_size,
            platform=args.platform,
            strict=args.strict,
            run_check=not args.no_check,
        )
    except ImportRefused as exc:
        print(" ".join(str(exc).split()), file=sys.stderr)
        return 2
    command = "python3 -m workflow_scripts.importers " + " ".join(args.files)
    with open(args.out, "w") as f:
        f.write(text(config, ledger, command))
    subs = len(config.get("substitutions", []))
    print(
        f"wrote {args.out}: {len(config['strategies'])} strategies ({', '.join(config['strategies'])}), "
        f"{subs} substitution{'s' if subs != 1 else ''}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
