"""The KV-cache decode suite (``flashcore bench --suite decode``): its cases, their byte counts, and what they
cost in memory and time.

A case is one :func:`flashcore.attention_with_kvcache` problem: ``Sq`` new query tokens per sequence against
``cache_len`` cached keys (every sequence full: ``cache_seqlens == cache_len``), the cache contiguous
``[B, cache_len, Hkv, D]`` (``page_size == 0``) or paged ``[B * cache_len / page_size, page_size, Hkv, D]`` with
the pages shuffled, in bf16 (the query's dtype) or FP8 e4m3 (``kv == "fp8"``, per-(sequence, head) descales).
Causal is bottom-right: with ``Sq > 1`` query ``i`` sees the first ``cache_len - Sq + i + 1`` keys (chunked
prefill, speculative tokens); with ``Sq == 1`` the one query sees the whole cache.

The suite is a main grid that moves one axis at a time around a base case (B 64, 32/8 heads, D 128, 8k-16k
keys, page 16 and contiguous, bf16, Sq 1), after the shapes the issue names (``MUST``), which run first so that a
time budget cuts the grid, never them. The full cross product of the axes (4 batches x 9 lengths x 3 head
layouts x 3 head dims x 5 layouts x 2 dtypes x 2 query lengths) would be thousands of cases.

Byte counts (the figure of merit of decode, which reads the cache once and does little arithmetic):
``kv_bytes`` = B x cache_len x Hkv x D x 2 tensors x element size, the K and V bytes the problem attends to;
for an FP8 cache ``kv_bytes_bf16`` is the same count at 2 bytes per element (what a bf16 cache of the same
problem would read). Pure Python: the CPU tests check the suite without a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .suites import _pairs

KV_DTYPES = ("bf16", "fp8")
KV_ELEMENT_SIZE = {"bf16": 2, "fp8": 1}
Q_ELEMENT_SIZE = 2  # q and out: bf16 (or fp16 with --dtype fp16)
GIB = 1024 ** 3
MIB = 1024 ** 2
SMALL_KV_BYTES = 256 * MIB  # at most ~0.1 ms of reading: latency matters, so host and CUDA-graph times are kept
# Memory a case may need (inputs, the dense copy SDPA reads, the float64 reference's temporaries): the CPU
# test keeps every case below it, and the runner skips a case whose estimate exceeds the free memory.
MAX_CASE_BYTES = 40 * GIB


@dataclass(frozen=True)
class DecodeCase:
    B: int
    Hq: int
    Hkv: int
    D: int
    cache_len: int
    Sq: int = 1
    page_size: int = 0  # 0: contiguous cache
    kv: str = "bf16"
    causal: bool = True

    def __post_init__(self):
        if min(self.B, self.Hq, self.Hkv, self.D, self.cache_len, self.Sq) < 1:
            raise ValueError(f"decode case sizes must be positive: {self}")
        if self.Hq % self.Hkv:
            raise ValueError(f"Hkv ({self.Hkv}) must divide Hq ({self.Hq})")
        if self.kv not in KV_DTYPES:
            raise ValueError(f"kv must be one of {KV_DTYPES}, got {self.kv!r}")
        if self.page_size < 0 or (self.page_size and self.cache_len % self.page_size):
            raise ValueError(f"page_size {self.page_size} must divide cache_len {self.cache_len}")
        if self.Sq > self.cache_len:
            raise ValueError(f"Sq ({self.Sq}) cannot exceed cache_len ({self.cache_len})")

    # ------------------------------------------------------------ the Shape-like view the runner needs
    is_varlen = False  # check.describe_mismatch: the canonical output is dense [B, Hq, Sq, D]

    @property
    def Sk(self) -> int:
        return self.cache_len

    @property
    def paged(self) -> bool:
        return self.page_size > 0

    @property
    def fp8(self) -> bool:
        return self.kv == "fp8"

    @property
    def layout(self) -> str:
        return f"page{self.page_size}" if self.paged else "contig"

    @property
    def num_pages(self) -> int:
        """Pages in the pool (each sequence owns cache_len / page_size of them); 0 for a contiguous cache."""
        return self.B * (self.cache_len // self.page_size) if self.paged else 0

    @property
    def key(self) -> str:
        """Stable identifier (``--compare`` matches cases by it)."""
        core = f"dec-{self.B}x{self.Hq}x{self.Sq}x{self.D}-L{self.cache_len}-kv{self.Hkv}-{self.layout}-{self.kv}"
        return core + ("-causal" if self.causal and self.Sq > 1 else "")

    @property
    def label(self) -> str:
        q = f"q{self.Sq}" + (" causal" if self.causal and self.Sq > 1 else "")
        layout = f"p{self.page_size}" if self.paged else "contig"
        return f"{self.B}×{self.Hq}/{self.Hkv}×D{self.D} L{_tokens(self.cache_len)} {q} {layout} {self.kv}"

    # ------------------------------------------------------------ arithmetic
    @property
    def kv_element_size(self) -> int:
        return KV_ELEMENT_SIZE[self.kv]

    def kv_bytes(self, element_size: Optional[int] = None) -> int:
        """Bytes of K and V attended: B x cache_len x Hkv x D x 2 tensors x element size (the cache's own
        unless ``element_size`` is given: 2 gives the bf16-equivalent count of an FP8 cache)."""
        size = self.kv_element_size if element_size is None else element_size
        return self.B * self.cache_len * self.Hkv * self.D * 2 * size

    @property
    def kv_bytes_bf16(self) -> int:
        return self.kv_bytes(2)

    def io_bytes(self, q_element_size: int = Q_ELEMENT_SIZE) -> int:
        """Minimal HBM traffic: read q and the K/V attended, write out."""
        return 2 * self.B * self.Sq * self.Hq * self.D * q_element_size + self.kv_bytes()

    def visible_pairs_per_head(self) -> int:
        return self.B * _pairs(self.Sq, self.cache_len, self.causal)

    @property
    def flops(self) -> int:
        """Two matmuls of 2·D FLOPs per visible (query, key) pair and query head."""
        return 4 * self.Hq * self.D * self.visible_pairs_per_head()

    @property
    def small(self) -> bool:
        """Latency-bound: the kernel reads little, so host latency and CUDA-graph time are recorded too."""
        return self.kv_bytes() <= SMALL_KV_BYTES

    def to_dict(self) -> dict:
        """The result file's ``shape``: the keys of the other suites' shapes (Sk = cache_len, varlen null), plus
        the cache's layout and dtype."""
        return {"B": self.B, "Hq": self.Hq, "Hkv": self.Hkv, "Sq": self.Sq, "Sk": self.cache_len, "D": self.D,
                "causal": self.causal, "varlen": None, "cache_len": self.cache_len, "page_size": self.page_size,
                "layout": self.layout, "kv_dtype": self.kv}


def _tokens(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def case(B: int, cache_len: int, *, heads=(32, 8), D: int = 128, page: int = 0, kv: str = "bf16", Sq: int = 1,
         causal: bool = True) -> DecodeCase:
    return DecodeCase(B, heads[0], heads[1], D, cache_len, Sq, page, kv, causal)


# ---------------------------------------------------------------- the suite
K = 1024
# The shapes the issue requires, in the order they run (page size 1 last: the slowest gather, and the layout
# the peers have been measured least on).
MUST: tuple = (
    case(64, 8 * K), case(64, 8 * K, page=16),                       # the base, 8k and 16k
    case(64, 16 * K), case(64, 16 * K, page=16),
    case(1, 64 * K), case(1, 64 * K, page=16),                       # one long sequence
    case(1, 4 * K), case(1, 4 * K, page=16),                         # latency-bound
    case(64, 8 * K, page=64), case(64, 8 * K, page=128),             # page sizes
    case(1, 64 * K, page=64), case(1, 64 * K, page=128),
    case(64, 16 * K, kv="fp8"), case(64, 16 * K, page=16, kv="fp8"),  # FP8 cache
    case(1, 64 * K, kv="fp8"), case(1, 64 * K, page=16, kv="fp8"),
    case(4, 8 * K, Sq=512), case(4, 8 * K, Sq=512, page=16),        # chunked prefill (causal)
    case(64, 8 * K, page=1), case(1, 64 * K, page=1),
)
# One axis at a time around the base (contiguous and page 16 each, unless said).
MAIN: tuple = (
    case(1, 16 * K), case(1, 16 * K, page=16),                       # batch x length
    case(1, 128 * K), case(1, 128 * K, page=16),
    case(8, 8 * K), case(8, 8 * K, page=16),
    case(8, 32 * K), case(8, 32 * K, page=16),
    case(64, 4 * K), case(64, 4 * K, page=16),
    case(128, 2 * K, heads=(64, 8)), case(128, 2 * K, heads=(64, 8), page=16),  # as in ANCHORS.md
    case(64, 8 * K, heads=(64, 8)), case(64, 8 * K, heads=(64, 8), page=16),    # heads
    case(64, 8 * K, heads=(32, 32)), case(64, 8 * K, heads=(32, 32), page=16),
    case(64, 8 * K, D=64), case(64, 8 * K, D=64, page=16),                      # head dim
    case(64, 8 * K, D=256), case(64, 8 * K, D=256, page=16),
    case(64, 8 * K, Sq=4), case(64, 8 * K, Sq=4, page=16),                      # speculative tokens (causal)
    case(1, 64 * K, Sq=4),
)
DECODE: tuple = MUST + tuple(c for c in MAIN if c not in MUST)
# The chunked-prefill rows of MUST alone (a short run when only the prefill route changed)
PREFILL: tuple = tuple(c for c in MUST if c.Sq > 16)
DECODE_SUITES: dict = {"decode": DECODE, "decode-must": MUST, "decode-prefill": PREFILL}


def is_decode_suite(name: str) -> bool:
    return name in DECODE_SUITES


# ---------------------------------------------------------------- planning: memory and time
def rotation_sets(c: DecodeCase, l2_bytes: int, q_element_size: int = Q_ELEMENT_SIZE) -> int:
    """Input sets the timing cycles through (1: the cache is far larger than L2 and the L2 is flushed)."""
    from . import timing

    io = c.io_bytes(q_element_size)
    return timing.rotation_sets(io, l2_bytes) if timing.use_rotation(io, l2_bytes) else 1


def set_bytes(c: DecodeCase, q_element_size: int = Q_ELEMENT_SIZE) -> int:
    """Device memory of one input set: q, the cache, the dense cache SDPA reads (the cache itself when it is
    contiguous bf16, else a second copy in q's dtype), the page table, one output per backend (5)."""
    q = c.B * c.Sq * c.Hq * c.D * q_element_size
    dense = 0 if (not c.paged and not c.fp8) else c.kv_bytes(q_element_size)
    table = 4 * c.num_pages
    return 6 * q + c.kv_bytes() + dense + table


def reference_bytes(c: DecodeCase) -> int:
    """Peak temporaries of the float64 reference on one sequence (it runs on two, one at a time): the gathered
    K/V in float64, repeated to the query heads, and three score-sized tensors."""
    gathered = 2 * c.cache_len * c.Hkv * c.D * (8 + c.kv_element_size)
    repeated = 2 * c.cache_len * c.Hq * c.D * 8
    scores = 3 * c.Hq * c.Sq * c.cache_len * 8
    return gathered + repeated + scores


def memory_estimate(c: DecodeCase, l2_bytes: int, q_element_size: int = Q_ELEMENT_SIZE) -> int:
    """Bytes a case holds at its peak: every input set plus the reference's temporaries, 10% margin for the
    backends' workspaces (split-KV partials, FA4's LSE)."""
    sets = rotation_sets(c, l2_bytes, q_element_size)
    return int(1.1 * (sets * set_bytes(c, q_element_size) + reference_bytes(c)))


def time_estimate_s(c: DecodeCase, n_backends: int, rep_ms: float, bandwidth_gbps: float = 2500.0,
                    warmup_ms: float = 25.0, flush_ms: float = 0.1) -> float:
    """GPU seconds the timing of a case should take (compilation excluded): per backend, the event-timed run
    (warm-up, then ``rep_ms`` or 30 calls, whichever is longer, each after an L2 flush when not rotating) and
    do_bench's run (the same again), at ``bandwidth_gbps``."""
    from . import timing

    call_ms = c.io_bytes() / (bandwidth_gbps * 1e9) * 1e3 + 0.01
    n_warm, n_rep = timing.plan_repeats(call_ms, rep_ms, warmup_ms)
    per_call = call_ms + (flush_ms if rotation_sets(c, timing.DEFAULT_L2_BYTES) == 1 else 0.0)
    ours = (n_warm + n_rep + 5) * per_call
    do_bench = warmup_ms + max(rep_ms, call_ms)
    return n_backends * (ours + do_bench) / 1e3


__all__ = ["DecodeCase", "case", "MUST", "MAIN", "DECODE", "DECODE_SUITES", "is_decode_suite", "memory_estimate",
           "time_estimate_s", "rotation_sets", "set_bytes", "reference_bytes", "MAX_CASE_BYTES"]
