"""``python -m libreyolo_core.weights inspect PATH``: one JSON line on stdout.

Exit 0 with the :class:`~libreyolo_core.weights.WeightsInfo` as JSON, or exit 4 with
``{"error": "<reason>"}`` (the reason names the file and what is wrong). Exit 2 on bad usage.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "inspect":
        print("usage: python -m libreyolo_core.weights inspect PATH", file=sys.stderr)
        return 2
    from libreyolo_core.weights import inspect_weights
    from libreyolo_core.weights.errors import CheckpointError

    try:
        info = inspect_weights(args[1])
    except CheckpointError as exc:
        print(json.dumps({"error": str(exc)}))
        return 4
    print(json.dumps(info.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
