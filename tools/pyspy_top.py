"""Aggregate a py-spy raw (collapsed) profile into the functions that hold a thread's time, on the machine that
recorded it (raw files run to tens of MB).

    py-spy record --nonblocking --threads --format raw -o prof.txt -- python3 scripts/train_bench.py ...
    python3 tools/pyspy_top.py prof.txt --within training_step --top 40 > prof_top.txt

Inclusive: the share of samples whose stack holds the function (anywhere); self: the share where it is the
innermost frame. --within keeps only stacks holding that function (e.g. the step, or Lightning's run loop).
"""

import argparse
import re
from collections import Counter


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("raw")
    p.add_argument("--within", default=None, help="keep stacks holding a frame that contains this text")
    p.add_argument("--top", type=int, default=40)
    a = p.parse_args()
    incl, own, total = Counter(), Counter(), 0
    for line in open(a.raw):
        stack, _, n = line.rstrip("\n").rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]  # one entry per function, not per line
        if a.within and not any(a.within in f for f in frames):
            continue
        total += int(n)
        for f in set(frames):
            incl[f] += int(n)
        own[frames[-1]] += int(n)
    print(f"samples: {total}" + (f" (stacks holding {a.within!r})" if a.within else ""))
    for title, c in (("inclusive", incl), ("self", own)):
        print(f"\n{title}:")
        for f, n in c.most_common(a.top):
            print(f"{100 * n / max(total, 1):6.1f}%  {f}")


if __name__ == "__main__":
    main()
