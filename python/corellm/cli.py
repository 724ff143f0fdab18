"""The `corellm` command line: subcommands for serving and generating."""

from __future__ import annotations

import argparse
import sys

import corellm


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="corellm", description="corellm LLM inference engine")
    parser.add_argument("--version", action="version", version=f"corellm {corellm.__version__}")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("serve", help="serve a model over an OpenAI-compatible API")
    args = parser.parse_args(argv)
    if args.command == "serve":
        print(
            "corellm serve: the OpenAI-compatible server is not built yet (it arrives with the "
            "server issue); the native core is installed and tested (`make test`).",
            file=sys.stderr,
        )
        return 2
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
