"""The benchmark's report: the machine it ran on, and its figures as Markdown tables."""

import platform
from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name (Linux), with AVX-512 noted: figures differ between machines."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown CPU"
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "")
    flags = next((line for line in info.splitlines() if line.startswith("flags")), "")
    return f"{name or 'unknown CPU'}{', AVX-512' if 'avx512f' in flags else ''}{' with bf16' if 'avx512_bf16' in flags else ''}"


def markdown(report: dict) -> str:
    f = lambda x, spec=".2f": "—" if x is None else format(x, spec)  # noqa: E731
    times = lambda x: "—" if x is None else f"{x:.2f}x"  # noqa: E731
    on = f"on {report.get('device', 'cpu')}; transformers on {report.get('transformers_device') or 'none'}"
    lines = [f"Machine: {report['machine']}", "", f"Decode, {on}:", "",
             "| model | dtype | weights | picospec ms/token | transformers ms/token | picospec speedup | "
             "weights-stream ms | roofline fraction | picospec compile s |", "|---|---|---|---|---|---|---|---|---|"]
    for d in report["decode"]:
        lines.append(f"| {d['model']} | {d['dtype']} | {'real' if d['real_weights'] else 'random'} | "
                     f"{f(d['picospec_ms_per_token'])} | {f(d['transformers_ms_per_token'])} | "
                     f"{times(d['vs_transformers'])} | {f(d['weights_stream_ms'])} | {f(d['roofline_fraction'])} | "
                     f"{f(d['picospec_compile_seconds'], '.1f')} |")
    for p in report["pairs"]:
        lines += ["", f"**{p['pair']}** (draft:target), {p['dtype']}, {on}: c = {p['c']:.3f}; "
                  + ", ".join(f"v({K}) = {v:.2f}" for K, v in p["v"].items()), "",
                  "| K | alpha | tokens/call | picospec speedup | theory | theory, calls alternating | "
                  "transformers assisted speedup |", "|---|---|---|---|---|---|---|"]
        for r in p["rows"]:
            hf = r.get("transformers_assisted")
            lines.append(f"| {r['K']} | {r['alpha']:.3f} | {r['tokens_per_call']:.2f} | {r['speedup']:.2f}x | "
                         f"{r['predicted_speedup']:.2f}x | {r['predicted_speedup_alternating']:.2f}x | "
                         f"{times(hf and hf['speedup'])} |")
        if real := p.get("real_gpt2_prediction"):
            lines += ["", f"Real GPT-2 124M -> 1558M, predicted ({p['dtype']}): alpha = {real['alpha']:.3f}, implied by "
                      "jaymody's published 2.23x at K = 4; theory for K = 1..8: "
                      + ", ".join(f"{K}: {s:.2f}x" for K, s in real["theory_by_K"].items()), "",
                      "| K | tokens/call | iteration cost (AR steps, measured) | predicted speedup (measured cost) | "
                      "theory (c, v(K)) |", "|---|---|---|---|---|"]
            lines += [f"| {r['K']} | {r['tokens_per_call']:.2f} | {r['iteration_cost']:.2f} | "
                      f"{r['from_iteration_cost']:.2f}x | {r['theory']:.2f}x |" for r in real["rows"]]
    for b in report.get("batch", []):
        lines += ["", f"**{b['pair']}**, {on}, B prompts at once, greedy, K = {b['K']}, {b['n_tokens']} tokens each "
                  "(tokens/s over the whole batch; transformers: batched generate)", "",
                  "| B | autoregressive tok/s | speculative tok/s | speedup | theory | alpha | v_B(K) | "
                  "transformers tok/s |", "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['B']} | {r['ar_tokens_per_second']:.0f} | {r['spec_tokens_per_second']:.0f} | "
                  f"{r['speedup']:.2f}x | {r['predicted_speedup']:.2f}x | {r['alpha']:.2f} | {r['v']:.2f} | "
                  f"{f(r.get('transformers_tokens_per_second'), '.0f')} |" for r in b["rows"]]
    if report.get("startup"):
        lines += ["", f"Start-up, {on}:", "", "| pair | first token, cold (s) | first token, warm (s) |", "|---|---|---|"]
        lines += [f"| {s['pair']} | {s['cold_seconds']:.2f} | {s['warm_seconds']:.2f} |" for s in report["startup"]]
    return "\n".join(lines)
