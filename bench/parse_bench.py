"""What bounded parsing (`vgpu_formats.yamlio`) costs, and what it saves on hostile texts.

Ratios against plain PyYAML (libyaml's CSafeLoader) in the same run:
- a normal scheduler conf and a 2 MB multi-document manifest: checked load / plain load;
- a 327-byte alias bomb: time to refuse it, and what walking the plain load costs (json.dumps, as
  the scheduler-conf renderer did before);
- a 10 KB nested text: refused, where copying the plain load raises RecursionError.

    python -m bench parse_bench
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from vgpu_formats import yamlio

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "cluster"
PLAIN: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefg", "bcdefgh", strict=True))


def best_of(runs: int, work: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best


def refused(text: str) -> Callable[[], None]:
    def work() -> None:
        try:
            yamlio.load(text)
        except yaml.YAMLError:
            return
        raise AssertionError("accepted")
    return work


def main() -> None:
    conf = str(yaml.safe_load((FIXTURES / "volcano-scheduler.yaml").read_text().split("\n---\n")[0])
               ["data"]["volcano-scheduler.conf"])
    manifest = "\n---\n".join(path.read_text() for path in sorted(FIXTURES.iterdir()))
    big = ("---\n" + manifest) * max(1, 2_000_000 // len(manifest))

    def checked_conf() -> None:
        yamlio.clear_cache()
        yamlio.load(conf)

    plain = best_of(50, lambda: yaml.load(conf, Loader=PLAIN))
    ours = best_of(50, checked_conf)
    print(f"scheduler conf ({len(conf)} B): plain {plain * 1e3:.2f} ms, bounded {ours * 1e3:.2f} ms "
          f"(x{ours / plain:.2f})")
    plain = best_of(3, lambda: list(yaml.load_all(big, Loader=PLAIN)))
    ours = best_of(3, lambda: yamlio.load_all(big))
    print(f"manifest ({len(big) / 1e6:.1f} MB): plain {plain:.2f} s, bounded {ours:.2f} s "
          f"(x{ours / plain:.2f})")

    one_level_less = BOMB.rsplit("\n", 2)[0]  # 9^7 strings when walked: seconds, not minutes
    walk = best_of(1, lambda: json.dumps(yaml.load(one_level_less, Loader=PLAIN)))
    refuse = best_of(5, refused(BOMB))
    print(f"alias bomb ({len(BOMB)} B): refused in {refuse * 1e3:.2f} ms; walking its plain load (one "
          f"level less) takes {walk:.2f} s (x{walk / refuse:.0f})")
    deep = "x: " + "[" * 5000 + "]" * 5000
    try:
        copy.deepcopy(yaml.load(deep, Loader=PLAIN))  # every reader copies or walks what it loaded
        plain_says = "loaded and copied"
    except RecursionError:
        plain_says = "loaded, then RecursionError when copied"
    print(f"nested 10 KB: plain load -> {plain_says}; bounded refuses in "
          f"{best_of(5, refused(deep)) * 1e3:.2f} ms")
