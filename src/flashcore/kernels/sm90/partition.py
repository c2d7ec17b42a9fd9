"""What the partitions of the sm_90 forward kernel share, as two Gluon aggregates: the runtime values
(:class:`Shared`: descriptors, shared-memory buffers, barriers, scalars) and the compile-time form
(:class:`Form`: the constexpr parameters). ``warp_specialize`` then passes two values to each partition
instead of 42 arguments spelled out per partition; the machine code is byte-identical to the spelled-out
form (``tests/test_machine_code.py``).

The aggregate decorator comes from ``gluon_compat`` (its name differs between Triton versions). No
``from __future__ import annotations`` in this module: an aggregate checks its fields' annotated types at
compile time."""
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import constexpr_function
from triton.language.core import base_value

from .gluon_compat import aggregate


@constexpr_function
def _value(x):
    """A scalar the launcher specialised to a constant (an int equal to 1, or None) arrives as a plain Python
    value: keep it a constexpr, so the aggregate holds it like the spelled-out argument would be."""
    return x if isinstance(x, base_value) else gl.constexpr(x)


@aggregate
class Shared:
    """The kernel's runtime arguments and the buffers and barriers it allocates, as every partition sees them."""
    q_desc: base_value
    k_desc: base_value
    v_desc: base_value
    o_desc: base_value
    w_desc: base_value
    q_smem: base_value
    k_smem: base_value
    v_smem: base_value
    w_smem: base_value
    q_ready: base_value
    q_empty: base_value
    k_ready: base_value
    v_ready: base_value
    k_empty: base_value
    v_empty: base_value
    stagger: base_value
    lse_ptr: base_value
    seqlens_q_ptr: base_value
    qk_scale: base_value
    seqlen_q: base_value
    seqlen_k: base_value
    num_heads: base_value
    group: base_value
    lse_stride_b: base_value
    lse_stride_h: base_value
    num_m_tiles: base_value
    num_tiles: base_value
    v_clean: base_value
    page_table: base_value
    table_stride: base_value
    v_landed: base_value
    seqlens_k_ptr: base_value

    @constexpr_function
    def __init__(self, q_desc, k_desc, v_desc, o_desc, w_desc, q_smem, k_smem, v_smem, w_smem, q_ready, q_empty,
                 k_ready, v_ready, k_empty, v_empty, stagger, lse_ptr, seqlens_q_ptr, qk_scale, seqlen_q, seqlen_k,
                 num_heads, group, lse_stride_b, lse_stride_h, num_m_tiles, num_tiles, v_clean, page_table,
                 table_stride, v_landed, seqlens_k_ptr):
        self.q_desc, self.k_desc, self.v_desc = _value(q_desc), _value(k_desc), _value(v_desc)
        self.o_desc, self.w_desc = _value(o_desc), _value(w_desc)
        self.q_smem, self.k_smem = _value(q_smem), _value(k_smem)
        self.v_smem, self.w_smem = _value(v_smem), _value(w_smem)
        self.q_ready, self.q_empty = _value(q_ready), _value(q_empty)
        self.k_ready, self.v_ready = _value(k_ready), _value(v_ready)
        self.k_empty, self.v_empty = _value(k_empty), _value(v_empty)
        self.stagger = _value(stagger)
        self.lse_ptr, self.seqlens_q_ptr, self.qk_scale = _value(lse_ptr), _value(seqlens_q_ptr), _value(qk_scale)
        self.seqlen_q, self.seqlen_k = _value(seqlen_q), _value(seqlen_k)
        self.num_heads, self.group = _value(num_heads), _value(group)
        self.lse_stride_b, self.lse_stride_h = _value(lse_stride_b), _value(lse_stride_h)
        self.num_m_tiles, self.num_tiles = _value(num_m_tiles), _value(num_tiles)
        self.v_clean, self.page_table, self.table_stride = _value(v_clean), _value(page_table), _value(table_stride)
        self.v_landed, self.seqlens_k_ptr = _value(v_landed), _value(seqlens_k_ptr)


@aggregate
class Form:
    """The kernel's compile-time form: its constexpr parameters (the warpgroup index stays a separate argument)."""
    BLOCK_M: gl.constexpr
    BLOCK_N: gl.constexpr
    HEAD_DIM: gl.constexpr
    K_STAGES: gl.constexpr
    V_STAGES: gl.constexpr
    CAUSAL: gl.constexpr
    RETURN_LSE: gl.constexpr
    NUM_WG: gl.constexpr
    PAIRED: gl.constexpr
    SECURE: gl.constexpr
    SUM_MMA: gl.constexpr
    TRACE: gl.constexpr
    EARLY_LOADS: gl.constexpr
    STAGGER: gl.constexpr
    KEY_LENS: gl.constexpr
    PAGE_SIZE: gl.constexpr
    SANITISE: gl.constexpr
    SECRET_DIAG: gl.constexpr
    PDL_WAIT: gl.constexpr
    V_PREPASS: gl.constexpr

    @constexpr_function
    def __init__(self, BLOCK_M, BLOCK_N, HEAD_DIM, K_STAGES, V_STAGES, CAUSAL, RETURN_LSE, NUM_WG, PAIRED, SECURE,
                 SUM_MMA, TRACE, EARLY_LOADS, STAGGER, KEY_LENS, PAGE_SIZE, SANITISE, SECRET_DIAG, PDL_WAIT,
                 V_PREPASS):
        self.BLOCK_M, self.BLOCK_N, self.HEAD_DIM = gl.constexpr(BLOCK_M), gl.constexpr(BLOCK_N), gl.constexpr(HEAD_DIM)
        self.K_STAGES, self.V_STAGES = gl.constexpr(K_STAGES), gl.constexpr(V_STAGES)
        self.CAUSAL, self.RETURN_LSE = gl.constexpr(CAUSAL), gl.constexpr(RETURN_LSE)
        self.NUM_WG, self.PAIRED, self.SECURE = gl.constexpr(NUM_WG), gl.constexpr(PAIRED), gl.constexpr(SECURE)
        self.SUM_MMA, self.TRACE = gl.constexpr(SUM_MMA), gl.constexpr(TRACE)
        self.EARLY_LOADS, self.STAGGER = gl.constexpr(EARLY_LOADS), gl.constexpr(STAGGER)
        self.KEY_LENS, self.PAGE_SIZE = gl.constexpr(KEY_LENS), gl.constexpr(PAGE_SIZE)
        self.SANITISE, self.SECRET_DIAG = gl.constexpr(SANITISE), gl.constexpr(SECRET_DIAG)
        self.PDL_WAIT, self.V_PREPASS = gl.constexpr(PDL_WAIT), gl.constexpr(V_PREPASS)
