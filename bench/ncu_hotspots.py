"""Top SASS lines of an Nsight Compute source page by warp-stall samples (device bench helper).

    ncu -i REPORT --page source --csv --print-source sass > page.csv
    python -m bench.ncu_hotspots page.csv [N]

Prints the N lines with the most stall samples (all samples, then not-issued), their share of the
kernel's samples and the SASS, and the samples summed by opcode."""
import collections
import csv
import re
import sys


def main(path: str, n: int = 40) -> None:
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    head_i = next(i for i, r in enumerate(rows) if any("Sampling" in c for c in r))
    head, body = rows[head_i], rows[head_i + 1:]
    src = next(i for i, c in enumerate(head) if c.strip() in ("Source", "SASS", "Instruction"))
    samp = [i for i, c in enumerate(head) if "Sampling" in c]
    print("columns:", [head[i] for i in [src, *samp]])

    def num(r, i):
        try:
            return float(r[i].replace(",", ""))
        except (ValueError, IndexError):
            return 0.0

    total = sum(num(r, samp[0]) for r in body) or 1.0
    by_op = collections.Counter()
    for r in body:
        sass = re.sub(r"^@!?U?P[T0-9]+\s+", "", r[src].strip())
        op = sass.split(" ")[0] if sass else "?"
        by_op[op] += num(r, samp[0])
    for r in sorted(body, key=lambda r: -num(r, samp[0]))[:n]:
        print(f"{100 * num(r, samp[0]) / total:5.1f}%  " + "  ".join(f"{num(r, i):8.0f}" for i in samp)
              + f"  {r[src].strip()[:90]}")
    print("by opcode:", ", ".join(f"{op} {100 * v / total:.1f}%" for op, v in by_op.most_common(20)))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40)
