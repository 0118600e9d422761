#!/usr/bin/env python3
"""bench-native.py -- the native benchmark (examples/native_bench.rs) and its plots.

    scripts/bench-native.py [--quick] [--out DIR] [--bin PATH]

Runs the example (built with `cargo build --release --features
bench-internals --example native_bench` unless --bin names it), which prints
every figure (median of three runs, min and max) and writes them as TSV;
then draws from that TSV, as plain SVG (Python's standard library only):

  DIR/native-path.svg   GB/s per core of the CPU path for each dirty ratio,
                        beside the plain read of memory (the memory's limit)
  DIR/native-scale.svg  the time to build the tables, register every chunk
                        and save 1 % dirty, and the library's heap, against
                        guest size (1, 2, 4 TiB)
  DIR/native-bench.tsv  the figures

DIR is docs/ by default, target/bench-native/ with --quick (CI: checks that
it runs; quick figures mean little and are not committed).
"""

import argparse
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"]


def run(args):
    binary = args.bin
    if binary is None:
        subprocess.run(
            ["cargo", "build", "--release", "--features", "bench-internals", "--example", "native_bench"],
            cwd=ROOT,
            check=True,
        )
        target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
        binary = os.path.join(target, "release", "examples", "native_bench")
    tsv = os.path.join(args.out, "native-bench.tsv")
    cmd = [binary, "--tsv", tsv] + (["--quick"] if args.quick else [])
    subprocess.run(cmd, check=True)
    figures = {}
    with open(tsv) as f:
        for line in f:
            section, name, median, *_ = line.rstrip("\n").split("\t")
            figures[name] = median
    return figures


def num(figures, name):
    return float(figures[name])


class Svg:
    def __init__(self, width, height):
        self.width, self.height = width, height
        self.parts = []

    def text(self, x, y, s, size=12, anchor="start", rotate=None, weight="normal"):
        turn = f' transform="rotate({rotate} {x} {y})"' if rotate else ""
        s = s.replace("&", "&amp;").replace("<", "&lt;")
        self.parts.append(
            f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
            f'font-weight="{weight}"{turn}>{s}</text>'
        )

    def line(self, x1, y1, x2, y2, colour="#000", width=1, dash=None):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.parts.append(
            f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{colour}" stroke-width="{width}"{d}/>'
        )

    def rect(self, x, y, w, h, colour):
        self.parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{colour}"/>')

    def circle(self, x, y, colour):
        self.parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{colour}"/>')

    def write(self, path):
        with open(path, "w") as f:
            f.write(
                f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{self.height}" '
                f'font-family="sans-serif">\n<rect width="100%" height="100%" fill="white"/>\n'
            )
            f.write("\n".join(self.parts))
            f.write("\n</svg>\n")


def log_axis(svg, x0, y0, w, h, lo, hi, label):
    """A log10 y axis from lo to hi over [y0, y0 + h] (bottom at y0 + h); returns the mapping."""
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))

    def y(v):
        return y0 + h - (math.log10(v) - a) / (b - a) * h

    for e in range(a, b + 1):
        yy = y(10**e)
        svg.line(x0, yy, x0 + w, yy, "#ddd")
        svg.text(x0 - 6, yy + 4, f"{10**e:g}", 11, "end")
    svg.line(x0, y0, x0, y0 + h)
    svg.line(x0, y0 + h, x0 + w, y0 + h)
    svg.text(x0 - 48, y0 + h / 2, label, 12, "middle", rotate=-90)
    return y


def path_plot(figures, out):
    cases = ["1% random", "1% clustered", "10% random", "10% clustered", "100% all"]
    groups = [("first touch", [("all-zero pages", "first touch, all-zero pages"), ("data pages", "first touch, data pages")])]
    groups += [(c, [("save_bitmap", f"{c}: save_bitmap, dirty"), ("save_ranges", f"{c}: save_ranges, dirty")]) for c in cases]
    plain = num(figures, "plain read (the memory's limit), all runs of (a)")
    values = [num(figures, k) for _, bars in groups for _, k in bars] + [plain]
    svg = Svg(860, 430)
    x0, y0, w, h = 80, 50, 740, 300
    svg.text(svg.width / 2, 24, "CPU path, dirty GB/s per core (median of 3), against a plain read of memory", 14, "middle", weight="bold")
    y = log_axis(svg, x0, y0, w, h, min(values) / 2, max(values) * 2, "GB/s per core (log)")
    gw = w / len(groups)
    for i, (name, bars) in enumerate(groups):
        for j, (bar, key) in enumerate(bars):
            v = num(figures, key)
            bx = x0 + i * gw + 12 + j * (gw - 24) / 2
            bw = (gw - 24) / 2 - 4
            colour = COLOURS[j] if i else COLOURS[2 + j]
            svg.rect(bx, y(v), bw, y0 + h - y(v), colour)
            svg.text(bx + bw / 2, y(v) - 4, f"{v:.0f}", 10, "middle")
        svg.text(x0 + i * gw + gw / 2, y0 + h + 18, name, 11, "middle")
    svg.line(x0, y(plain), x0 + w, y(plain), "#000", 1.5, "6 4")
    svg.text(x0 + w, y(plain) - 5, f"plain read of memory: {plain:.1f} GB/s", 11, "end")
    legend = [(COLOURS[2], "first touch: all-zero pages"), (COLOURS[3], "first touch: data pages"),
              (COLOURS[0], "later window: save_bitmap"), (COLOURS[1], "later window: save_ranges")]
    for k, (colour, label) in enumerate(legend):
        lx = x0 + k * 190
        svg.rect(lx, y0 + h + 34, 12, 12, colour)
        svg.text(lx + 16, y0 + h + 45, label, 11)
    svg.write(os.path.join(out, "native-path.svg"))


def scale_plot(figures, out):
    sizes = sorted({name.split(":")[0] for name in figures if name.endswith(": tables built (both sides), wall")},
                   key=lambda s: float(s.split()[0]) * (1024 if s.endswith("TiB") else 1))
    if not sizes:
        return
    tib = [float(s.split()[0]) / (1 if s.endswith("TiB") else 1024) for s in sizes]
    times = [("tables built (wall)", "tables built (both sides), wall"),
             ("every chunk registered (CPU)", "every chunk registered (both sides), CPU"),
             ("1 % dirty saved (CPU)", "1% dirty saved (save_bitmap through the path), CPU")]
    heaps = [("tables built", "library heap, tables built"), ("every chunk registered", "library heap, every chunk registered")]
    svg = Svg(860, 400)
    svg.text(svg.width / 2, 24, "Scale: both sides' tables against guest size (median of 3)", 14, "middle", weight="bold")
    panels = [("seconds", times, 1.0), ("library heap, MiB", heaps, 1 / (1 << 20))]
    for p, (label, series, factor) in enumerate(panels):
        x0, y0, w, h = 80 + p * 420, 50, 320, 270
        top = max(num(figures, f"{s}: {k}") * factor for s in sizes for _, k in series) * 1.15
        svg.line(x0, y0, x0, y0 + h)
        svg.line(x0, y0 + h, x0 + w, y0 + h)
        svg.text(x0 - 50, y0 + h / 2, label, 12, "middle", rotate=-90)
        for t in range(6):
            v = top * t / 5
            yy = y0 + h - v / top * h
            svg.line(x0, yy, x0 + w, yy, "#eee")
            svg.text(x0 - 6, yy + 4, f"{v:.3g}", 11, "end")
        xs = [x0 + (t / tib[-1]) * w for t in tib]
        for x, s in zip(xs, sizes):
            svg.text(x, y0 + h + 18, s, 11, "middle")
        for c, (name, key) in enumerate(series):
            pts = [(x, y0 + h - num(figures, f"{s}: {key}") * factor / top * h) for x, s in zip(xs, sizes)]
            for (ax, ay), (bx, by) in zip(pts, pts[1:]):
                svg.line(ax, ay, bx, by, COLOURS[c], 2)
            for x, yy in pts:
                svg.circle(x, yy, COLOURS[c])
            svg.rect(x0 + 8, y0 + 8 + c * 16, 12, 12, COLOURS[c])
            svg.text(x0 + 24, y0 + 18 + c * 16, name, 11)
        # The line through the origin and the first size: linear growth.
        base = max(num(figures, f"{sizes[0]}: {k}") * factor for _, k in series)
        svg.line(x0, y0 + h, xs[-1], y0 + h - base * tib[-1] / tib[0] / top * h, "#888", 1, "4 4")
    svg.text(svg.width / 2, 392, "dashed: linear from the smallest size (top series)", 11, "middle")
    svg.write(os.path.join(out, "native-scale.svg"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--bin")
    args = ap.parse_args()
    if args.out is None:
        args.out = os.path.join(ROOT, "target", "bench-native") if args.quick else os.path.join(ROOT, "docs")
    os.makedirs(args.out, exist_ok=True)
    figures = run(args)
    path_plot(figures, args.out)
    scale_plot(figures, args.out)
    print(f"bench-native: figures and plots in {args.out}")


if __name__ == "__main__":
    sys.exit(main())
