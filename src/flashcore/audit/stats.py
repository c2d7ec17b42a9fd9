"""Statistics for the audit gates (numpy only): Welch's t, dudect's percentile cropping, paired t
(timing gate); a one-way ANOVA class-effect test (:func:`class_effect_pvalue`, counters gate).

dudect (Reparaz, Balasch, Verbauwhede, "Dude, is my code constant time?", DATE 2017) runs Welch's
t-test between two classes of timings, plus the same test on measurements cropped at a ladder of
upper percentiles (timing noise is one-sided: interrupts, clock changes), plus a second-order test
(Welch's t on the squared deviations from each class's mean). It reports the largest |t|; |t| > 4.5
is the conventional "a difference was detected" threshold (TVLA). This module reproduces that and
adds a paired test on order-randomised pairs (A,B or B,A), which cancels slow drift.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

T_THRESHOLD = 4.5
DUDECT_NUMBER_PERCENTILES = 100


def _normal_quantile(p: float) -> float:
    """Inverse standard normal CDF (Acklam's rational approximation, |error| < 1.2e-9)."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    a = (-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
         1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00)
    b = (-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
         6.680131188771972e+01, -1.328068155288572e+01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
         -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00)
    plow = 0.02425
    if p < plow:
        q = math.sqrt(-2 * math.log(p))
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / \
               ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    if p > 1 - plow:
        return -_normal_quantile(1 - p)
    q = p - 0.5
    r = q * q
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / \
           (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        de = d * c
        h *= de
        if abs(de - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float, y: Optional[float] = None) -> float:
    """Regularised incomplete beta I_x(a, b); ``y`` = 1 - x when the caller has it without cancellation."""
    y = 1.0 - x if y is None else y
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(y)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbt) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbt) * _betacf(b, a, y) / b


def t_cdf(t: float, df: float) -> float:
    """Student-t CDF."""
    if not math.isfinite(df) or df > 1e7:
        return 0.5 * math.erfc(-t / math.sqrt(2.0))
    if t == 0.0:
        return 0.5
    t2 = t * t
    # tail = P(T > |t|) = I_x(df/2, 1/2) / 2 with x = df/(df+t^2); near t = 0 use the mirrored form.
    x, y = df / (df + t2), t2 / (df + t2)
    if y < 0.5:
        tail = 0.5 * (1.0 - betainc(0.5, df / 2.0, y, x))
    else:
        tail = 0.5 * betainc(df / 2.0, 0.5, x, y)
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """Student-t quantile: the normal quantile refined by bisection on the exact CDF (|error| < 1e-9)."""
    z = _normal_quantile(p)
    if not math.isfinite(df) or df > 1e7:
        return z
    df = max(float(df), 1.0)
    lo, hi = z - 1.0, z + 1.0
    while t_cdf(lo, df) > p:
        lo = lo * 2.0 - 1.0 if lo < 0 else lo - 1.0
    while t_cdf(hi, df) < p:
        hi = hi * 2.0 + 1.0 if hi > 0 else hi + 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, abs(mid)):
            break
    return 0.5 * (lo + hi)


def two_sided_p_normal(t: float) -> float:
    """Two-sided p-value of |t| under a standard normal (the large-sample limit of Student's t)."""
    if not math.isfinite(t):
        return 0.0
    return math.erfc(abs(t) / math.sqrt(2.0))


def welch_t(a: Sequence[float], b: Sequence[float], *, ci: float = 0.95) -> dict:
    """Welch's unequal-variance t-test of mean(a) - mean(b).

    Returns n_a, n_b, mean_a, mean_b, var_a, var_b (ddof=1), diff, se, t, df (Welch-Satterthwaite),
    ci (two-sided, Student-t with df degrees of freedom) and p_normal (large-sample p-value).
    t is 0 when both samples are constant and equal, +-inf when constant and different.
    """
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    na, nb = a.size, b.size
    if na < 2 or nb < 2:
        raise ValueError(f"welch_t needs at least 2 samples per class, got {na} and {nb}")
    ma, mb = float(a.mean()), float(b.mean())
    va, vb = float(a.var(ddof=1)), float(b.var(ddof=1))
    diff = ma - mb
    sa, sb = va / na, vb / nb
    se = math.sqrt(sa + sb)
    if se == 0.0:
        t = 0.0 if diff == 0.0 else math.copysign(math.inf, diff)
        df = float(na + nb - 2)
    else:
        t = diff / se
        den = (sa * sa / (na - 1) if na > 1 else 0.0) + (sb * sb / (nb - 1) if nb > 1 else 0.0)
        df = (sa + sb) ** 2 / den if den > 0 else float(na + nb - 2)
    q = t_quantile(0.5 + ci / 2, df)
    return {"n_a": na, "n_b": nb, "mean_a": ma, "mean_b": mb, "var_a": va, "var_b": vb,
            "diff": diff, "se": se, "t": t, "df": df, "ci": [diff - q * se, diff + q * se], "ci_level": ci,
            "p_normal": two_sided_p_normal(t)}


def paired_t(a: Sequence[float], b: Sequence[float], *, ci: float = 0.95) -> dict:
    """Paired t-test on d_i = a_i - b_i (a_i, b_i measured back to back, in random order)."""
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    if a.size != b.size:
        raise ValueError(f"paired_t needs equal-length samples, got {a.size} and {b.size}")
    d = a - b
    n = d.size
    if n < 2:
        raise ValueError("paired_t needs at least 2 pairs")
    md = float(d.mean())
    sd = float(d.std(ddof=1))
    se = sd / math.sqrt(n)
    if se == 0.0:
        t = 0.0 if md == 0.0 else math.copysign(math.inf, md)
    else:
        t = md / se
    q = t_quantile(0.5 + ci / 2, n - 1)
    return {"n": n, "mean_diff": md, "sd_diff": sd, "se": se, "t": t, "df": n - 1,
            "ci": [md - q * se, md + q * se], "ci_level": ci, "p_normal": two_sided_p_normal(t),
            "median_diff": float(np.median(d))}


def dudect_percentiles(x: Sequence[float], n: int = DUDECT_NUMBER_PERCENTILES) -> np.ndarray:
    """dudect's crop thresholds: the (1 - 0.5^(10 (i+1) / n))-quantiles of x, i = 0..n-1 (increasing)."""
    x = np.asarray(x, dtype=np.float64).ravel()
    qs = 1.0 - np.power(0.5, 10.0 * (np.arange(n) + 1) / n)
    return np.quantile(x, qs)


def dudect(a: Sequence[float], b: Sequence[float], *, n_crops: int = DUDECT_NUMBER_PERCENTILES,
           min_n: Optional[int] = None, threshold: float = T_THRESHOLD) -> dict:
    """dudect's battery on two classes of timings.

    Tests: "uncropped" (Welch on everything), "crop[i]" (Welch on measurements < the i-th dudect
    percentile of the pooled data; the same threshold for both classes) and "second_order" (Welch
    on (x - class mean)^2 of the uncropped data). A test enters the maximum only when each class
    has at least ``min_n`` samples in it (dudect uses 10^4 measurements; default here:
    min(10^4, a tenth of the smaller class), at least 2).
    Returns the uncropped and second-order results, every crop's (threshold, n_a, n_b, t), and
    ``max_abs_t`` with the name of the test that gave it, and ``leak`` = max_abs_t > threshold.
    """
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    if min_n is None:
        min_n = max(2, min(10_000, min(a.size, b.size) // 10))
    unc = welch_t(a, b)
    so = welch_t((a - a.mean()) ** 2, (b - b.mean()) ** 2)
    thr = dudect_percentiles(np.concatenate([a, b]), n_crops) if n_crops > 0 else np.array([])
    crops = []
    best_name, best_t = "uncropped", abs(unc["t"])
    if abs(so["t"]) > best_t:
        best_name, best_t = "second_order", abs(so["t"])
    best_crop = None
    for i, th in enumerate(thr):
        ca, cb = a[a < th], b[b < th]
        entry = {"i": i, "threshold": float(th), "n_a": int(ca.size), "n_b": int(cb.size), "t": None}
        if ca.size >= max(min_n, 2) and cb.size >= max(min_n, 2):
            r = welch_t(ca, cb)
            entry["t"] = r["t"]
            entry["diff"] = r["diff"]
            if abs(r["t"]) > best_t:
                best_name, best_t, best_crop = f"crop[{i}]", abs(r["t"]), entry
        crops.append(entry)
    crop_ts = [abs(c["t"]) for c in crops if c["t"] is not None]
    return {
        "uncropped": unc,
        "second_order": {"t": so["t"], "diff": so["diff"]},
        "crops": crops,
        "max_abs_t_cropped": max(crop_ts) if crop_ts else None,
        "max_abs_t": best_t,
        "max_test": best_name,
        "max_crop": best_crop,
        "min_n": min_n,
        "threshold": threshold,
        "leak": bool(best_t > threshold),
    }


def summarize(x: Sequence[float]) -> dict:
    x = np.asarray(x, dtype=np.float64).ravel()
    if x.size == 0:
        return {"n": 0}
    p = np.percentile(x, [1, 5, 50, 95, 99])
    return {"n": int(x.size), "mean": float(x.mean()), "std": float(x.std(ddof=1)) if x.size > 1 else 0.0,
            "min": float(x.min()), "p1": float(p[0]), "p5": float(p[1]), "median": float(p[2]),
            "p95": float(p[3]), "p99": float(p[4]), "max": float(x.max())}


def detectable_difference(sd_a: float, sd_b: float, n_a: int, n_b: int, threshold: float = T_THRESHOLD) -> float:
    """Smallest mean difference whose expected |t| reaches ``threshold`` with these sample sizes."""
    return threshold * math.sqrt(sd_a ** 2 / max(n_a, 1) + sd_b ** 2 / max(n_b, 1))


def class_effect_pvalue(groups: list) -> Optional[float]:
    """One-way ANOVA F-test of "the class changes the value" for a noisy counter.

    groups: one list of repetitions per class. Returns the F-test p-value (F distribution with
    G-1 and N-G degrees of freedom, through :func:`betainc`), 1.0 when every value is equal, 0.0
    when the classes differ but no class varies within itself, and None when there is no repetition
    to measure the within-class noise (N == G). Used by the counters gate and its per-instruction
    comparison (:mod:`.counters`, :mod:`.pc_counts`)."""
    groups = [np.asarray([float(x) for x in g], dtype=np.float64) for g in groups if len(g) > 0]
    G = len(groups)
    N = sum(g.size for g in groups)
    if G < 2 or N <= G:
        return None
    allv = np.concatenate(groups)
    grand = allv.mean()
    ssb = float(sum(g.size * (g.mean() - grand) ** 2 for g in groups))
    ssw = float(sum(((g - g.mean()) ** 2).sum() for g in groups))
    if ssb == 0.0:
        return 1.0
    if ssw == 0.0:
        return 0.0
    d1, d2 = G - 1, N - G
    F = (ssb / d1) / (ssw / d2)
    x = d2 / (d2 + d1 * F)  # P(F' > F) = I_x(d2/2, d1/2)
    return float(betainc(d2 / 2.0, d1 / 2.0, x, d1 * F / (d2 + d1 * F)))
