"""`rollout cache stats DIR` and `rollout cache gc DIR`: the generation cache's contents
and its clean-up (docs/cache.md)."""

from __future__ import annotations

import argparse
import json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="inspect or clean a generation cache", description=__doc__)
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    stats = verbs.add_parser("stats", help="rows, segments and bytes of a cache")
    stats.add_argument("dir", help="the cache directory")
    stats.add_argument("--json", action="store_true", help="print JSON")
    stats.set_defaults(run=_stats)
    gc = verbs.add_parser("gc", help="remove unreferenced segments, then old or excess ones")
    gc.add_argument("dir", help="the cache directory")
    gc.add_argument("--max-bytes", type=int, help="remove least recently used segments until under this size")  # fmt: skip
    gc.add_argument("--older-than-days", type=float, help="remove segments unused for this long")
    gc.set_defaults(run=_gc)


def _open(path: str):
    from rollout.cache import GenerationCache

    return GenerationCache(path, create=False)


def _stats(args: argparse.Namespace) -> int:
    cache = _open(args.dir)
    stats = cache.stats()
    cache.close()
    if args.json:
        print(json.dumps(stats))
    else:
        print(f"cache {stats['path']} ({stats['version']}): {stats['rows']} rows in "
              f"{stats['segments']} segments, {stats['bytes'] / 1e6:.1f} MB on disk "
              f"({stats['segment_files']} segment files)")  # fmt: skip
    return 0


def _gc(args: argparse.Namespace) -> int:
    cache = _open(args.dir)
    older = args.older_than_days * 86400 if args.older_than_days is not None else None
    done = cache.gc(args.max_bytes, older)
    stats = cache.stats()
    cache.close()
    print(f"removed {done['segments_removed']} segments ({done['rows_removed']} rows); "
          f"{stats['rows']} rows, {stats['bytes'] / 1e6:.1f} MB left")  # fmt: skip
    return 0
