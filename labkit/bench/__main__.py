"""``python -m labkit.bench NAME [options]``: run one registered benchmark."""

from __future__ import annotations

import sys

from labkit.bench import names, resolve


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m labkit.bench NAME [options]   (NAME --help for its options)")
        print("benchmarks: " + ", ".join(names()))
        return 0 if argv else 2
    try:
        bench = resolve(argv[0])
    except KeyError as e:
        print(e.args[0], file=sys.stderr)
        return 2
    return bench(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
