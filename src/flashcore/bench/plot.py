"""One PNG per run: TFLOP/s per backend per shape, flashcore highlighted, the matmul roof dashed."""
from __future__ import annotations

from typing import Optional

FLASHCORE_COLORS = {"flashcore": "#d62728", "flashcore-secure": "#ff9896"}
# Peers in muted greys and blues, so the eye lands on flashcore first.
PEER_COLORS = ["#4c72b0", "#7f98c4", "#a9bad6", "#5f6b7a", "#8c96a3", "#b5bcc4", "#3b4f6b", "#c9d3e3"]


PLOT_EXTRA = "flashcore[plot]"


class PlotUnavailable(RuntimeError):
    """The chart needs matplotlib, an optional dependency (the ``plot`` extra)."""


def require_matplotlib():
    """matplotlib, or :class:`PlotUnavailable` saying how to install it (it is not a base dependency)."""
    try:
        import matplotlib
    except ImportError as e:
        raise PlotUnavailable(f"the chart (--plot) needs matplotlib, which is not installed: install {PLOT_EXTRA} "
                              f"(pip install '{PLOT_EXTRA}')") from e
    return matplotlib


def _colors(names: list) -> dict:
    peers = iter(PEER_COLORS * 2)
    return {n: FLASHCORE_COLORS.get(n) or next(peers) for n in names}


def _backend_order(doc: dict) -> list:
    names = []
    for entry in doc["results"]:
        for name, r in entry["backends"].items():
            if r["status"] == "ok" and name not in names:
                names.append(name)
    # flashcore first, then the others in registry order
    return sorted(names, key=lambda n: (n not in FLASHCORE_COLORS, list(doc["backends"]).index(n)
                                        if n in doc["backends"] else 99))


def plot_document(doc: dict, path: str, title: Optional[str] = None) -> str:
    matplotlib = require_matplotlib()
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = doc["results"]
    names = _backend_order(doc)
    colors = _colors(names)
    n_shapes, n_back = max(1, len(entries)), max(1, len(names))
    width = 0.8 / n_back
    fig, ax = plt.subplots(figsize=(max(8.0, 1.3 * n_shapes + 3), 6.0), dpi=130)
    for j, name in enumerate(names):
        xs, ys = [], []
        for i, entry in enumerate(entries):
            r = entry["backends"].get(name)
            if r and r["status"] == "ok" and r.get("tflops") is not None:
                xs.append(i - 0.4 + (j + 0.5) * width)
                ys.append(r["tflops"])
        is_fc = name in FLASHCORE_COLORS
        bars = ax.bar(xs, ys, width=width, color=colors[name], label=doc["backends"].get(name, {}).get("label", name),
                      edgecolor="black" if is_fc else "none", linewidth=0.6 if is_fc else 0, zorder=3)
        if name == "flashcore":
            for bar, y in zip(bars, ys):
                ax.annotate(f"{y:.0f}", (bar.get_x() + bar.get_width() / 2, y), xytext=(0, 2),
                            textcoords="offset points", ha="center", va="bottom", fontsize=7,
                            color=colors[name], fontweight="bold")
    _roof(ax, doc)
    ax.set_xticks(range(len(entries)))
    ax.set_xticklabels([_tick_label(e) for e in entries], fontsize=8)
    ax.set_ylabel("TFLOP/s (forward)")
    ax.set_xlim(-0.6, len(entries) - 0.4)
    ax.grid(axis="y", alpha=0.3, zorder=0)
    ax.spines[["top", "right"]].set_visible(False)
    ax.set_title(title or _default_title(doc), fontsize=11)
    ax.legend(fontsize=7, ncol=min(5, max(1, len(names))), frameon=False, loc="upper center",
              bbox_to_anchor=(0.5, -0.16))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _tick_label(entry: dict) -> str:
    """Shape, then flashcore's speed-up over the fastest peer (the number a reader looks for)."""
    label = entry["label"].replace("-causal", "\ncausal")
    ratio = (entry["backends"].get("flashcore") or {}).get("vs_fastest_peer")
    if ratio is not None:
        label += f"\n{ratio:.2f}× best peer"
    return label


def _roof(ax, doc: dict) -> None:
    c = doc.get("ceilings")
    if not c:
        return
    ax.axhline(c["matmul_tflops"], linestyle="--", color="black", linewidth=1, zorder=2)
    ax.annotate(f"{c['matmul']['dtype']} matmul 8192³: {c['matmul_tflops']:.0f} TFLOP/s",
                (1.0, c["matmul_tflops"]), xycoords=("axes fraction", "data"), xytext=(-4, 3),
                textcoords="offset points", ha="right", va="bottom", fontsize=8)


def _default_title(doc: dict) -> str:
    env = doc["environment"]
    gpu = (env.get("gpu") or {}).get("name", "no GPU")
    return f"Attention forward, {doc['config']['dtype']} — {gpu} — {env['date'][:10]} ({env.get('git_sha', '?')[:7]})"


# ---------------------------------------------------------------- the decode suite
DECODE_MARKERS = {"flashcore": "o", "flashcore-secure": "D", "sdpa-default": "s", "fa4": "^", "flashinfer": "v"}


def decode_series(doc: dict) -> dict:
    """backend → [(case index, K/V TB/s)] of the cases it was timed on (what the decode chart draws)."""
    out = {}
    for i, entry in enumerate(doc["results"]):
        for name, r in entry["backends"].items():
            if r["status"] == "ok" and r.get("kv_gbps") is not None:
                out.setdefault(name, []).append((i, r["kv_gbps"] / 1000.0))
    return out


def plot_decode(doc: dict, path: str, title: Optional[str] = None) -> str:
    """One marker per backend and case: K/V bytes read per second (TB/s), with the copy ceiling of the run
    dashed (and the read-only figure dotted); the cases the issue requires come first, left of the line."""
    matplotlib = require_matplotlib()
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = doc["results"]
    series = decode_series(doc)
    names = sorted(series, key=lambda n: (n not in FLASHCORE_COLORS, list(doc["backends"]).index(n)
                                          if n in doc["backends"] else 99))
    colors = _colors(names)
    fig, ax = plt.subplots(figsize=(max(10.0, 0.32 * len(entries) + 3), 6.5), dpi=130)
    for name in names:
        xs, ys = zip(*series[name])
        is_fc = name in FLASHCORE_COLORS
        ax.plot(xs, ys, linestyle="none", marker=DECODE_MARKERS.get(name, "x"), markersize=6 if is_fc else 5,
                color=colors[name], markeredgecolor="black" if name == "flashcore" else colors[name],
                markeredgewidth=0.5, label=doc["backends"].get(name, {}).get("label", name), zorder=4 if is_fc else 3)
    c = doc.get("ceilings") or {}
    if c.get("copy_gbps"):
        ax.axhline(c["copy_gbps"] / 1000, linestyle="--", color="black", linewidth=1, zorder=2)
        ax.annotate(f"copy ceiling (this run): {c['copy_gbps'] / 1000:.2f} TB/s", (1.0, c["copy_gbps"] / 1000),
                    xycoords=("axes fraction", "data"), xytext=(-4, 3), textcoords="offset points", ha="right",
                    va="bottom", fontsize=8)
    if c.get("read_gbps"):
        ax.axhline(c["read_gbps"] / 1000, linestyle=":", color="grey", linewidth=1, zorder=2)
    must = [i for i, e in enumerate(entries) if (e.get("decode") or {}).get("must_have")]
    if must and len(must) < len(entries):
        ax.axvline(max(must) + 0.5, color="grey", linewidth=0.6, zorder=1)
        for x, text, ha in ((max(must) + 0.3, "required shapes", "right"), (max(must) + 0.7, "main grid", "left")):
            ax.annotate(text, (x, 0.0), xycoords=("data", "axes fraction"), xytext=(0, 3), textcoords="offset points",
                        ha=ha, va="bottom", fontsize=7, color="grey")
    ax.set_xticks(range(len(entries)))
    ax.set_xticklabels([e["label"] for e in entries], rotation=70, ha="right", fontsize=6.5)
    ax.set_ylabel("K/V bytes read per second (TB/s)")
    ax.set_xlim(-0.6, max(len(entries), 1) - 0.4)
    ax.set_ylim(bottom=0)
    ax.grid(axis="y", alpha=0.3, zorder=0)
    ax.spines[["top", "right"]].set_visible(False)
    env = doc["environment"]
    gpu = (env.get("gpu") or {}).get("name", "no GPU")
    ax.set_title(title or f"KV-cache decode, {doc['config']['dtype']} q — {gpu} — {env['date'][:10]} "
                          f"({env.get('git_sha', '?')[:7]})", fontsize=11)
    ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
