"""``python -m bench <suite> [args]``: run one benchmark suite (each module has ``main(argv)``)."""

from __future__ import annotations

import importlib
import sys

#: suite name -> module with a ``main(argv: list[str]) -> int | None``
SUITES = {
    "attention": "bench.attention",
    "gpu_attention": "bench.gpu_attention",
    "gpu_train": "bench.gpu_train",
    "quick": "bench.quick",
    "engine": "bench.engine",
    "baselines": "bench.baselines",
    "e2e": "bench.e2e",
    "soak": "bench.soak",
    "scale": "bench.scale",
    "report": "bench.report",
    "analyse": "bench.analyse",
    "browser": "bench.browser",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUITES:
        print(f"usage: python -m bench <suite> [args]; suites: {', '.join(sorted(SUITES))}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(SUITES[argv[0]])
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
