"""Terminal output (rich): the results table, the comparison table, `flashcore info`."""
from __future__ import annotations

from typing import Optional

from rich.table import Table
from rich.text import Text

STATUS_STYLE = {"ok": "green", "wrong": "bold red", "error": "red", "oom": "magenta", "unsupported": "yellow",
                "skipped": "dim", "unavailable": "dim"}
FLASHCORE = ("flashcore", "flashcore-secure")


def _num(value: Optional[float], fmt: str = "{:.1f}") -> str:
    return "–" if value is None else fmt.format(value)


def _ratio(value: Optional[float]) -> Text:
    if value is None:
        return Text("–")
    style = "green" if value >= 1.0 else "red"
    return Text(f"{value:.2f}×", style=style)


def one_line(shape, name: str, result: dict) -> Text:
    """A log line per finished (shape, backend)."""
    line = Text(f"{shape.label:<24} {name:<17} ")
    line.append(f"{result['status']:<12}", style=STATUS_STYLE.get(result["status"], ""))
    if result["status"] == "ok":
        t = result["timing"]
        line.append(f" {t['median_us']:10.1f} µs  p99 {t['p99_us']:.1f}  rel err {result['rel_err']:.1e}")
    elif result["reason"]:
        line.append(" " + result["reason"][:120], style="dim")
    return line


def results_table(doc: dict) -> Table:
    env = doc["environment"]
    gpu = (env.get("gpu") or {}).get("name", "no GPU")
    table = Table(title=f"flashcore bench — {gpu} — {doc['config']['dtype']} — {env['date']}", title_style="bold",
                  caption=_caption(doc), caption_justify="left")
    for header, justify in (("shape", "left"), ("backend", "left"), ("status", "left"), ("median µs", "right"),
                            ("µs/head", "right"), ("TFLOP/s", "right"), ("%mm", "right"), ("%BW", "right"),
                            ("vs SDPA", "right"), ("vs peer", "right"), ("host µs", "right"), ("graph µs", "right"),
                            ("note", "left")):
        table.add_column(header, justify=justify, no_wrap=header != "note", overflow="fold")
    for entry in doc["results"]:
        names = list(entry["backends"])
        for i, name in enumerate(names):
            table.add_row(*_result_cells(entry, name, first=i == 0), end_section=i == len(names) - 1,
                          style="bold" if name in FLASHCORE else None)
    return table


def _result_cells(entry: dict, name: str, first: bool) -> list:
    r = entry["backends"][name]
    status = Text(r["status"], style=STATUS_STYLE.get(r["status"], ""))
    shape = entry["label"] if first else ""
    if r["status"] != "ok":
        return [shape, name, status] + ["–"] * 9 + [Text(r["reason"][:70], style="dim")]
    t = r["timing"]
    note = f"err {r['rel_err']:.1e}"
    if name == entry.get("fastest_peer"):
        note += ", fastest peer"
    if r.get("cuda_graph_status") not in (None, "ok"):
        note += ", " + r["cuda_graph_status"][:40]
    return [shape, name, status, f"{t['median_us']:.1f}", _num(r["us_per_head"], "{:.2f}"), _num(r["tflops"]),
            _num(_pct(r["frac_matmul_ceiling"]), "{:.0f}%"), _num(_pct(r["frac_copy_ceiling"]), "{:.0f}%"),
            _ratio(r["vs_sdpa_default"]), _ratio(r["vs_fastest_peer"]), _num(r["host_latency_us"]),
            _num(r["cuda_graph_us"], "{:.2f}"), Text(note, style="dim")]


def _pct(frac: Optional[float]) -> Optional[float]:
    return None if frac is None else 100.0 * frac


def _caption(doc: dict) -> str:
    c = doc.get("ceilings")
    parts = []
    if c:
        parts.append(f"ceilings (this run): {c['matmul']['dtype']} matmul 8192³ {c['matmul_tflops']:.0f} TFLOP/s "
                     f"(%mm), copy {c['copy_gbps']:.0f} GB/s (%BW: q,k,v,o bytes / time)")
    parts.append("vs SDPA / vs peer: speed-up (>1 faster) over SDPA default / the fastest non-flashcore backend")
    parts.append("timing: median of CUDA events, cold L2 (flush or input rotation); host/graph µs for small shapes")
    if doc.get("aborted"):
        parts.append(f"ABORTED: {doc['aborted']}")
    if doc.get("stopped"):
        parts.append(f"STOPPED EARLY: {doc['stopped']}")
    return "\n".join(parts)


def summary_table(doc: dict) -> Table:
    """One row per shape: flashcore against the fastest peer and SDPA (the at-a-glance view)."""
    table = Table(title="summary: flashcore vs the fastest peer", title_style="bold")
    for header, justify in (("shape", "left"), ("flashcore µs", "right"), ("TFLOP/s", "right"), ("%mm", "right"),
                            ("secure µs", "right"), ("secure/fast", "right"), ("fastest peer", "left"),
                            ("peer µs", "right"), ("vs peer", "right"), ("vs SDPA", "right")):
        table.add_column(header, justify=justify, no_wrap=True)
    for entry in doc["results"]:
        fc = entry["backends"].get("flashcore") or {}
        sec = entry["backends"].get("flashcore-secure") or {}
        peer_name = entry.get("fastest_peer")
        peer = entry["backends"].get(peer_name) if peer_name else None
        fc_us, sec_us = _median_us(fc), _median_us(sec)
        table.add_row(
            entry["label"],
            _num(fc_us) if fc_us is not None else Text(fc.get("status", "–"), style=STATUS_STYLE.get(fc.get("status"), "")),
            _num(fc.get("tflops")), _num(_pct(fc.get("frac_matmul_ceiling")), "{:.0f}%"),
            _num(sec_us) if sec_us is not None else Text(sec.get("status", "–"), style="dim"),
            # throughput ratio, as issue 4's bar (>= 0.9) states it: fast time / secure time
            _num(fc_us / sec_us if (sec_us and fc_us) else None, "{:.2f}"),
            peer_name or "–", _num(_median_us(peer)), _ratio(fc.get("vs_fastest_peer")), _ratio(fc.get("vs_sdpa_default")))
    return table


def _median_us(result: Optional[dict]) -> Optional[float]:
    if result and result.get("status") == "ok" and result.get("timing"):
        return result["timing"]["median_us"]
    return None


def compare_table(cmp: dict, path_a: str, path_b: str) -> Table:
    a, b = cmp["a"], cmp["b"]
    table = Table(title=f"B/A median time — A: {path_a} ({a['gpu']}, {a['git_sha'][:7] if a['git_sha'] else '?'}) "
                        f"· B: {path_b} ({b['gpu']}, {b['git_sha'][:7] if b['git_sha'] else '?'})",
                  caption="B/A < 1: B is faster", caption_justify="left")
    for header, justify in (("shape", "left"), ("backend", "left"), ("A µs", "right"), ("B µs", "right"),
                            ("B/A", "right"), ("change", "right"), ("note", "left")):
        table.add_column(header, justify=justify)
    last_key = None
    for row in cmp["rows"]:
        shape = row["label"] if row["key"] != last_key else ""
        last_key = row["key"]
        table.add_row(shape, row["backend"], _num(row["a_us"]), _num(row["b_us"]), _change_ratio(row["ratio"]),
                      _change_pct(row["ratio"]), Text(row["note"], style="dim"),
                      style="bold" if row["backend"] in FLASHCORE else None)
    return table


def _change_ratio(ratio: Optional[float]) -> Text:
    if ratio is None:
        return Text("–")
    style = "green" if ratio < 0.97 else ("red" if ratio > 1.03 else "")
    return Text(f"{ratio:.3f}", style=style)


def _change_pct(ratio: Optional[float]) -> Text:
    if ratio is None:
        return Text("–")
    speed = 1.0 / ratio - 1.0
    return Text(f"{speed:+.1%} speed", style="green" if speed > 0.03 else ("red" if speed < -0.03 else ""))


def compare_summary_table(cmp: dict) -> Table:
    table = Table(title="geometric mean of B/A per backend (shapes timed in both runs)")
    table.add_column("backend")
    table.add_column("B/A", justify="right")
    table.add_column("shapes", justify="right")
    for name, s in cmp["by_backend"].items():
        table.add_row(name, _change_ratio(s["geomean_ratio"]), str(s["shapes"]))
    return table


def info_tables(env: dict, availability: dict, labels: dict) -> list:
    versions = Table(title="flashcore info", show_header=False)
    versions.add_column("item", style="bold")
    versions.add_column("value")
    gpu = env.get("gpu")
    if gpu:
        clocks = gpu.get("clocks_mhz") or {}
        versions.add_row("GPU", f"{gpu['name']} (sm_{gpu['capability'].replace('.', '')}, {gpu['sm_count']} SMs, "
                                f"{gpu['memory_gib']} GiB)")
        versions.add_row("driver", str(gpu.get("driver") or "unknown (nvidia-smi not found)"))
        if clocks:
            versions.add_row("clocks (MHz)", ", ".join(f"{k} {v}" for k, v in clocks.items()))
    else:
        versions.add_row("GPU", "no CUDA device")
    for name, value in env["versions"].items():
        versions.add_row(name, "–" if value is None else str(value))
    versions.add_row("git sha", env.get("git_sha", "unknown"))
    backends = Table(title="benchmark backends")
    backends.add_column("backend", style="bold")
    backends.add_column("label")
    backends.add_column("available")
    backends.add_column("reason")
    for name, (ok, reason) in availability.items():
        backends.add_row(name, labels[name], Text("yes", style="green") if ok else Text("no", style="red"),
                         Text(reason or "", style="dim"))
    return [versions, backends]


# ---------------------------------------------------------------- the decode suite
def _tbs(gbps: Optional[float]) -> str:
    return "–" if gbps is None else f"{gbps / 1000:.2f}"


def decode_results_table(doc: dict) -> Table:
    """Every case × backend of a decode run: time, K/V bandwidth, fraction of the copy ceiling, error."""
    env = doc["environment"]
    gpu = (env.get("gpu") or {}).get("name", "no GPU")
    table = Table(title=f"flashcore bench --suite {doc['config']['suite']} — {gpu} — {env['date']}", title_style="bold",
                  caption=_decode_caption(doc), caption_justify="left")
    for header in ("case", "backend", "status", "median µs", "KV TB/s", "%copy", "bf16-eq TB/s", "vs peer",
                   "graph µs", "rel err", "note"):
        table.add_column(header, justify="left" if header in ("case", "backend", "status", "note") else "right",
                         no_wrap=header != "note", overflow="fold")
    for entry in doc["results"]:
        names = list(entry["backends"])
        for i, name in enumerate(names):
            r = entry["backends"][name]
            status = Text(r["status"], style=STATUS_STYLE.get(r["status"], ""))
            case = entry["label"] if i == 0 else ""
            if r["status"] != "ok":
                cells = [case, name, status] + ["–"] * 6 + [_num(r.get("rel_err"), "{:.1e}"),
                                                           Text(r["reason"][:90], style="dim")]
            else:
                note = "fastest peer" if name == entry.get("fastest_peer") else ""
                if r.get("cuda_graph_status") not in (None, "ok"):
                    note = ", ".join(x for x in (note, r["cuda_graph_status"][:50]) if x)
                cells = [case, name, status, f"{r['timing']['median_us']:.1f}", _tbs(r.get("kv_gbps")),
                         _num(_pct(r.get("frac_copy_ceiling")), "{:.0f}%"),
                         _tbs(r.get("kv_gbps_bf16_equiv")) if entry["decode"]["kv_dtype"] != "bf16" else "",
                         _ratio(r["vs_fastest_peer"]), _num(r.get("cuda_graph_us")),
                         _num(r.get("rel_err"), "{:.1e}"), Text(note, style="dim")]
            table.add_row(*cells, end_section=i == len(names) - 1, style="bold" if name in FLASHCORE else None)
    return table


def _decode_caption(doc: dict) -> str:
    c = doc.get("ceilings")
    parts = []
    if c:
        read = f", read-only (torch.sum) {c['read_gbps'] / 1000:.2f} TB/s" if c.get("read_gbps") else ""
        parts.append(f"ceilings (this run): copy {c['copy_gbps'] / 1000:.2f} TB/s (1 GiB D2D copy, read+written){read}; "
                     "%copy = K/V bytes read / time / copy ceiling")
    else:
        parts.append("no ceilings measured: " + doc["config"].get("ceilings_error", "disabled"))
    parts.append("KV TB/s: the bytes each backend reads (SDPA: the dense bf16 cache, also for FP8 cases); "
                 "bf16-eq: FP8 cases at 2 bytes per element")
    parts.append("vs peer: speed-up over the fastest non-flashcore backend; rel err vs the float64 reference")
    if doc.get("aborted"):
        parts.append(f"ABORTED: {doc['aborted']}")
    if doc.get("stopped"):
        parts.append(f"STOPPED EARLY: {doc['stopped']}")
    return "\n".join(parts)


def _us_tbs(result: Optional[dict]) -> Text:
    if not result:
        return Text("–")
    if result.get("status") != "ok" or not result.get("timing"):
        return Text(result.get("status", "–"), style=STATUS_STYLE.get(result.get("status"), "dim"))
    return Text(f"{result['timing']['median_us']:.1f} ({_tbs(result.get('kv_gbps'))})")


def decode_summary_table(doc: dict) -> Table:
    """One row per case: µs (KV TB/s) of each backend, flashcore's %copy, secure/fast, flashcore vs best peer."""
    names = [n for n in doc["config"]["backends"]]
    table = Table(title="decode summary: µs (KV TB/s)", title_style="bold")
    table.add_column("case", no_wrap=True)
    for name in names:
        table.add_column(name, justify="right", no_wrap=True)
    for header in ("fc %copy", "secure/fast", "best peer", "fc vs peer", "max err"):
        table.add_column(header, justify="right" if header != "best peer" else "left", no_wrap=True)
    for entry in doc["results"]:
        b = entry["backends"]
        fc, sec = b.get("flashcore") or {}, b.get("flashcore-secure") or {}
        fc_us, sec_us = _median_us(fc), _median_us(sec)
        errs = [r["rel_err"] for r in b.values() if r.get("rel_err") is not None]
        table.add_row(entry["label"] + (" *" if entry.get("decode", {}).get("must_have") else ""),
                      *[_us_tbs(b.get(n)) for n in names],
                      _num(_pct(fc.get("frac_copy_ceiling")), "{:.0f}%"),
                      _num(fc_us / sec_us if (fc_us and sec_us) else None, "{:.2f}"),
                      entry.get("fastest_peer") or "–", _ratio(fc.get("vs_fastest_peer")),
                      _num(max(errs) if errs else None, "{:.1e}"))
    table.caption = "* a shape the issue requires; secure/fast: fast time / secure time (throughput ratio)"
    table.caption_justify = "left"
    return table


def versions_markdown_table(doc_a: dict, doc_b: dict) -> str:
    """The README's table of one bench suite run under two Triton versions on one machine (``doc_a`` the newer):
    flashcore's and secure mode's median times under each, their ratio (b / a: > 1 means ``a`` is faster), and
    flashcore against SDPA within each run (same-run ratios)."""
    va, vb = (d["environment"]["versions"]["triton"] for d in (doc_a, doc_b))
    rows = [f"| shape | flashcore µs, triton {va} / {vb} | speed, {va} vs {vb} | secure µs, {va} / {vb} | "
            f"speed, {va} vs {vb} | flashcore vs SDPA, {va} / {vb} |", "|---|---|---|---|---|---|"]
    b_by_key = {e["key"]: e for e in doc_b["results"]}
    for ea in doc_a["results"]:
        eb = b_by_key.get(ea["key"])
        if eb is None:
            continue
        fa, fb = (_median_us(e["backends"].get("flashcore")) for e in (ea, eb))
        sa, sb = (_median_us(e["backends"].get("flashcore-secure")) for e in (ea, eb))
        pa, pb = (_median_us(e["backends"].get("sdpa-default")) for e in (ea, eb))
        pair = lambda x, y: f"{x:.1f} / {y:.1f}" if x and y else "-"  # noqa: E731
        speed = lambda x, y: f"{y / x:.2f}x" if x and y else "-"  # noqa: E731
        vs = lambda f, p: f"{p / f:.2f}x" if f and p else "-"  # noqa: E731
        rows.append(f"| {ea['label']} | {pair(fa, fb)} | {speed(fa, fb)} | {pair(sa, sb)} | {speed(sa, sb)} | "
                    f"{vs(fa, pa)} / {vs(fb, pb)} |")
    return "\n".join(rows)


def decode_markdown_table(doc: dict) -> str:
    """The README's decode table from one ``--suite decode``/``decode-must`` run: flashcore's median time, secure
    mode's throughput against it, SDPA and FA4 (same run), flashcore against the fastest peer, and flashcore's KV
    read rate with its fraction of the run's copy ceiling; for the flushed cases (K/V larger than the L2) the times
    with a clean L2 (flashcore / SDPA: no dirty write-back of the flush inside the call, ``timing_clean_l2``)."""
    rows = ["| case (B x Hq/Hkv x D, cache, Sq, layout, cache dtype) | flashcore µs | secure / fast | SDPA µs (dense) "
            "| FA4 µs | vs fastest peer | KV TB/s (% of copy ceiling) | clean L2 µs: flashcore / SDPA |",
            "|---|---|---|---|---|---|---|---|"]

    def clean_us(r):
        t = (r or {}).get("timing_clean_l2") if (r or {}).get("status") == "ok" else None
        return f"{t['median_us']:.1f}" if t else None

    def us_or_status(r):
        r = r or {}
        us = _median_us(r)
        return f"{us:.1f}" if us else r.get("status", "-")

    for e in doc["results"]:
        b = e["backends"]
        fc = b.get("flashcore") or {}
        fc_us, sec_us = _median_us(fc), _median_us(b.get("flashcore-secure"))
        secure = f"{fc_us / sec_us:.2f}" if fc_us and sec_us else "-"
        ratio = f"{fc['vs_fastest_peer']:.2f}x" if fc.get("vs_fastest_peer") else "-"
        rate = "-"
        if fc.get("kv_gbps") and fc.get("frac_copy_ceiling"):
            rate = f"{fc['kv_gbps'] / 1e3:.2f} ({fc['frac_copy_ceiling'] * 100:.0f}%)"
        clean = [clean_us(fc), clean_us(b.get("sdpa-default"))]
        clean = " / ".join(c or "-" for c in clean) if any(clean) else "-"
        rows.append(f"| {e['label']} | {us_or_status(fc)} | {secure} | {us_or_status(b.get('sdpa-default'))} | "
                    f"{us_or_status(b.get('fa4'))} | {ratio} | {rate} | {clean} |")
    return "\n".join(rows)


def bench_markdown_table(doc: dict) -> str:
    """The README's performance table from one dense ``--suite`` run: flashcore's median time (TFLOP/s), SDPA's
    default, FA4 and flex (same run), the fastest peer, flashcore against SDPA and against the fastest peer, the
    CUDA-graph and eager host times where the run measured them (small shapes), and secure mode's throughput
    relative to flashcore's."""
    rows = ["| shape B×H×S×D | flashcore µs (TFLOP/s) | SDPA default µs | FA4 µs | flex µs | fastest peer µs | "
            "flashcore vs SDPA | vs fastest peer | CUDA graph µs: flashcore / SDPA | eager host µs: flashcore / SDPA | "
            "secure / fast |", "|---|---|---|---|---|---|---|---|---|---|---|"]

    def us(r):
        t = _median_us(r)
        return f"{t:.1f}" if t else (r or {}).get("status", "-")

    def pair(a, b, key, fmt):
        x, y = (a or {}).get(key), (b or {}).get(key)
        return f"{fmt.format(x)} / {fmt.format(y)}" if x and y else "–"

    for e in doc["results"]:
        b = e["backends"]
        fc, sdpa, peer = b.get("flashcore") or {}, b.get("sdpa-default"), e.get("fastest_peer")
        fc_us, sec_us = _median_us(fc), _median_us(b.get("flashcore-secure"))
        tf = f" ({fc['tflops']:.0f})" if fc.get("tflops") else ""
        peer_us = f"{_median_us(b.get(peer)):.1f} ({peer})" if peer and _median_us(b.get(peer)) else "-"
        vs_sdpa = f"**{fc['vs_sdpa_default']:.2f}×**" if fc.get("vs_sdpa_default") else "-"
        vs_peer = f"{fc['vs_fastest_peer']:.2f}×" if fc.get("vs_fastest_peer") else "-"
        secure = f"{fc_us / sec_us:.2f}" if fc_us and sec_us else "-"
        rows.append(f"| {e['label']} | {us(fc)}{tf} | {us(sdpa)} | {us(b.get('fa4'))} | {us(b.get('flex'))} | "
                    f"{peer_us} | {vs_sdpa} | {vs_peer} | {pair(fc, sdpa, 'cuda_graph_us', '{:.1f}')} | "
                    f"{pair(fc, sdpa, 'host_latency_us', '{:.0f}')} | {secure} |")
    return "\n".join(rows)


def generate_markdown_table(doc: dict) -> str:
    """The README's table of one transformers ``generate`` run (``bench.experiments.hf_generate``): per
    implementation and batch, prefill and decode tokens/s, each against sdpa's at the same batch in the same run, the
    decode step's time, and how many leading greedy tokens equal sdpa's in every sequence (``agree``)."""
    rows = ["| impl | batch | prefill tok/s | x sdpa | decode tok/s | x sdpa | ms/step | agree |",
            "|---|---|---|---|---|---|---|---|"]
    base = {(r["batch"], r.get("padded", False)): r for r in doc["rows"] if r["impl"] == "sdpa"}
    for r in doc["rows"]:
        s = base.get((r["batch"], r.get("padded", False)))
        pre = f"{r['prefill_tok_s'] / s['prefill_tok_s']:.2f}" if s else "-"
        dec = f"{r['decode_tok_s'] / s['decode_tok_s']:.2f}" if s else "-"
        batch = f"{r['batch']}{' padded' if r.get('padded') else ''}"
        rows.append(f"| {r['impl']} | {batch} | {r['prefill_tok_s']:.0f} | {pre} | {r['decode_tok_s']:.0f} | {dec} | "
                    f"{r['decode_ms_per_step']:.2f} | {r.get('agree', '-')} |")
    return "\n".join(rows)
