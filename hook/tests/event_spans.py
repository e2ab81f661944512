# event_spans.py LIBVGPU [SECONDS]: on a real GPU, what CUDA events of a process's own say of its
# share when two processes time-slice one GPU (hook/README.md, "Fifth run on the H200").
# NVML's per-process samples, the SM limiter's input, give each sample period to one process on
# the H200, and its figure missed the kernels two tenants ran by up to 11 points. This measures
# the alternative a process has alone: each kernel bracketed by two timing events. A kernel's
# span (end less start) counts the time another context held the GPU while it was switched
# out, so the question is whether the smallest spans a process sees beside another are its
# kernel's cost alone: then kernels x that cost over the window is its share, from its own
# events, with no other process's help.
# Each tenant: back-to-back N x N fp32 matmuls, events around each, a synchronisation every 8;
# measured over the second half. Prints, per tenant: its share of the bare rate (the truth), and
# what each estimate made of it.
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any


def tenant(n: int, seconds: float, t0: float) -> None:
    import torch

    a = torch.randn(n, n, device="cuda")
    for _ in range(3):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
    time.sleep(max(0.0, t0 - time.time()))
    marks: list[tuple[Any, Any]] = []
    k, half = 0, time.time() + seconds  # the half's start, once reached
    started = False
    while time.time() - t0 < seconds:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a = (a @ a).clamp_(-1, 1)
        e.record()
        if started:
            marks.append((s, e))
        k += 1
        if k % 8 == 0:
            torch.cuda.synchronize()
        if not started and time.time() - t0 >= seconds / 2:
            torch.cuda.synchronize()
            half, started, marks = time.time(), True, []
    torch.cuda.synchronize()
    wall = time.time() - half
    spans = sorted(s.elapsed_time(e) for s, e in marks)  # ms
    first_to_last = marks[0][0].elapsed_time(marks[-1][1]) if marks else 0.0
    print(json.dumps({"kernels": len(spans), "wall": wall, "spans": spans, "gpu_window_ms": first_to_last}))


def run(
    lib: str, pair: list[str], n: int, seconds: float, base: dict[str, Any] | None
) -> list[dict[str, Any]]:
    t0 = time.time() + 6  # both start together, after torch's import and warm-up
    procs: list[subprocess.Popen[str]] = []
    for limit in pair:
        env = dict(os.environ)
        if limit != "bare":
            env.update(
                LD_PRELOAD=lib,
                CUDA_DEVICE_SM_LIMIT=limit,
                CUDA_DEVICE_MEMORY_LIMIT="0",
                CUDA_DEVICE_MEMORY_SHARED_CACHE=f"/tmp/event-spans-{limit}-{len(procs)}-{os.getpid()}.cache",
            )
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, "tenant", str(n), str(seconds), str(t0)],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    out = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    for limit, r in zip(pair, out, strict=True):
        s, w, k = r["spans"], r["wall"], r["kernels"]
        if not s:
            print(f"  {limit}: no kernels")
            continue
        line = {"limit": limit, "kernels/s": round(k / w, 1)}
        if base:
            cost = base["median"]
            line["share"] = round(100 * k / w / base["rate"], 1)
            line["spans<=1.1cost"] = f"{100 * sum(x <= 1.1 * cost for x in s) / len(s):.0f}%"
        line.update(
            {
                "min_ms": round(s[0], 3),
                "p10_ms": round(s[len(s) // 10], 3),
                "median_ms": round(statistics.median(s), 3),
                "sum_spans/wall": round(100 * sum(s) / 1000 / w, 1),
                "kernels*min/wall": round(100 * k * s[0] / 1000 / w, 1),
                "kernels*p10/wall": round(100 * k * s[len(s) // 10] / 1000 / w, 1),
            }
        )
        print("  " + json.dumps(line))
        r["median"] = statistics.median(s)
        r["rate"] = k / w
    return out


if __name__ == "__main__":
    if sys.argv[1] == "tenant":
        tenant(int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]))
        sys.exit(0)
    lib, seconds = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 12
    for n, pairs in (
        (8192, [["bare", "bare"], ["30", "60"], ["50", "50"], ["30", "none"]]),
        (2048, [["bare", "bare"], ["30", "60"]]),
    ):
        print(f"== {n} x {n} matmuls, alone, bare")
        base = run(lib, ["bare"], n, seconds / 2, None)[0]
        print(f"  cost alone (median span) {base['median']:.3f} ms, {base['rate']:.1f} kernels/s")
        for pair in pairs:
            print(f"== {n} x {n}, two at once: {' / '.join(pair)} (limits)")
            run(lib, [p if p != "none" else "0" for p in pair], n, seconds, base)
