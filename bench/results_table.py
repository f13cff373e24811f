#!/usr/bin/env python3
"""Turns bench_cpu's JSON output (--benchmark_out=FILE --benchmark_out_format=json) into the markdown
tables of bench/RESULTS.md. Usage: results_table.py FILE.json"""
import json
import sys


def main(path):
    data = json.load(open(path))
    rows = {"matmul": [], "elementwise": [], "softmax": [], "transpose": []}
    for b in data["benchmarks"]:
        name = b["name"].split("/min_time")[0]
        if name.startswith("BM_matmul"):
            a = dict(kv.split(":") for kv in name.split("/")[1:])
            shape = f"{a['B']}x " if a["B"] != "1" else ""
            shape += f"{a['M']}x{a['K']} @ {a['K']}x{a['N']}" + (" (B^T)" if a["tB"] == "1" else "")
            rows["matmul"].append(f"| {shape} | {b['kiln_GFLOPs']:.1f} | {b['blas_GFLOPs']:.1f} | "
                                  f"{b.get('dnnl_GFLOPs', float('nan')):.1f} | {b['ratio_vs_best']:.2f} |")
        elif name.startswith("BM_elementwise"):
            a = dict(kv.split(":") for kv in name.split("/")[1:])
            op = ["add", "mul", "exp"][int(a["op"])]
            n = int(a["n"])
            rows["elementwise"].append(f"| {op} | {n // (1 << 20)}M | {b['kiln_GBs']:.1f} | {b['triad_GBs']:.1f} | "
                                       f"{b['pct_of_triad']:.0f}% |")
        elif name.startswith("BM_softmax"):
            a = dict(kv.split(":") for kv in name.split("/")[1:])
            rows["softmax"].append(f"| {a['rows']} x {a['cols']} | {b['kiln_GBs']:.2f} | {b.get('dnnl_GBs', float('nan')):.2f} | "
                                   f"{b.get('ratio_vs_dnnl', float('nan')):.2f} |")
        elif name.startswith("BM_transpose"):
            n = name.split("/")[1]
            rows["transpose"].append(f"| {n} x {n} | {b['kiln_GBs']:.2f} | {b['memcpy_GBs']:.2f} |")
    print("| matmul (f32) | kiln GFLOP/s | OpenBLAS GFLOP/s | oneDNN GFLOP/s | kiln / fastest |")
    print("|---|---|---|---|---|")
    print("\n".join(rows["matmul"]))
    print("\n| elementwise (f32) | n | kiln GB/s | triad GB/s | % of triad |")
    print("|---|---|---|---|---|")
    print("\n".join(rows["elementwise"]))
    print("\n| softmax (f32, rows x cols) | kiln GB/s | oneDNN GB/s | kiln / oneDNN |")
    print("|---|---|---|---|")
    print("\n".join(rows["softmax"]))
    print("\n| transpose copy x.t().contiguous() | kiln GB/s | memcpy GB/s |")
    print("|---|---|---|")
    print("\n".join(rows["transpose"]))


if __name__ == "__main__":
    main(sys.argv[1])
