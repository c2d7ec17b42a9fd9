"""Every switch that changes what a plan runs, in one place, and all of them in every plan key.

* Environment variables (benchmarking and audit knobs, read at planning time):
  ``FLASHCORE_HOPPER_KERNEL`` (``triton`` | ``gluon_ws``) forces the Hopper fast path onto one kernel
  (ineligible inputs still run the Triton kernel); ``FLASHCORE_SECURE_KERNEL`` the same for secure mode;
  ``FLASHCORE_SECURE_V_ZEROING`` (``prepass`` | ``in_loop``) forces the secure Triton kernel's V zeroing;
  ``FLASHCORE_SECURE_V_PAD`` (``pairs`` | ``zeros``) the K/V pre-pass's V padding;
  ``FLASHCORE_SECURE_V_SEEN`` (``scalars``) secure decode's select of V's rows on a range and scalars where the
  policy takes the one from loaded tensors (``launch.triton_decode.seen_by_load``; the audit's control);
  ``FLASHCORE_SECURE_HOISTED`` (``off``) secure decode's key loop as before v48 where the policy hoists it
  (``launch.triton_decode.hoisted``; the audit's control, the same tiles; with splits, V's select on scalars as
  well, the form before v49).
* Switches of the sm_90 Gluon kernel (:class:`GluonSwitches`), for A/B measurements and the debug
  timeline: set them for a block of code with :func:`override`.

:func:`snapshot` is part of every plan key (``flashcore.problem``), so a changed knob takes effect on
the next call: no cache needs clearing."""
from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass, fields, replace

from ..runtime.launcher import triton_debug

SECURE_V_ZEROING_ENV = "FLASHCORE_SECURE_V_ZEROING"
SECURE_V_ZEROING_MODES = ("auto", "prepass", "in_loop")
HOPPER_KERNEL_ENV = "FLASHCORE_HOPPER_KERNEL"
HOPPER_KERNEL_MODES = ("auto", "triton", "gluon_ws")
SECURE_KERNEL_ENV = "FLASHCORE_SECURE_KERNEL"
SECURE_V_PAD_ENV = "FLASHCORE_SECURE_V_PAD"
SECURE_PAD_ENV = "FLASHCORE_SECURE_PAD"
SECURE_V_SEEN_ENV = "FLASHCORE_SECURE_V_SEEN"
SECURE_V_SEEN_MODES = ("auto", "scalars")
SECURE_HOISTED_ENV = "FLASHCORE_SECURE_HOISTED"
SECURE_HOISTED_MODES = ("auto", "off")
ENV_VARS = (HOPPER_KERNEL_ENV, SECURE_V_ZEROING_ENV, SECURE_KERNEL_ENV, SECURE_V_PAD_ENV, SECURE_PAD_ENV,
            SECURE_V_SEEN_ENV, SECURE_HOISTED_ENV)


@dataclass(frozen=True)
class GluonSwitches:
    """Switches of the sm_90 Gluon forward kernel (``kernels/sm90/fwd.py``); the defaults are what ships."""
    # Causal: persistent over pairs of row tiles (True), or one program per row tile (False)
    causal_pairs: bool = True
    # Fast path: row sums by MMA against a ones tile (True) or by adds (False); see _consume_tile
    fast_sum_mma: bool = False
    # Debug: the timeline trace (kernels/sm90/trace.py; fast path only: the buffer takes the secure lengths' argument)
    trace: bool = False
    # Fast path: the first work item's Q, K_0 and V_0 requested at kernel entry (EARLY_LOADS)
    early_loads: bool = True
    # Fast path, D=64: the consumer warpgroups' first items start staggered (0: off; STAGGER). At D=128 the
    # same switch measured -1..+2% (noise; perf-notes v16), so it stays off there
    stagger: int = 1
    # Secure mode, causal: V's padding written in the kernel by the loader warpgroup, no pre-pass ("on"), the V
    # pre-pass ("off"), or the planner's choice ("auto": plan.tables.secure_padding_in_kernel; perf-notes v34)
    secure_in_kernel_padding: str = "auto"
    # Secure mode: the Gluon kernel launched as a programmatic dependent of its pre-pass ("on"), after the pre-pass
    # completes ("off"), or the planner's choice ("auto": plan.tables.secure_prepass_pdl; perf-notes v44)
    secure_pdl: str = "auto"
    # Secure chunked prefill (plan.prefill): V's rows past each key length cleaned by the V pre-pass into a contiguous
    # copy ("prepass") or cleared in every tile by the loader warpgroup ("loader"), or the planner's choice
    # ("auto": plan.tables.secure_prefill_v_prepass; perf-notes v46)
    secure_prefill_v: str = "auto"


SWITCH_NAMES = tuple(f.name for f in fields(GluonSwitches))
_lock = threading.Lock()
_switches = GluonSwitches()


def gluon_switches() -> GluonSwitches:
    return _switches


@contextlib.contextmanager
def override(**switches):
    """Set Gluon kernel switches for the duration of a ``with`` block (process-wide: a benchmarking and
    debugging tool, not for concurrent serving). Unknown names raise ``TypeError``."""
    global _switches
    unknown = set(switches) - set(SWITCH_NAMES)
    if unknown:
        raise TypeError(f"unknown Gluon switch(es) {sorted(unknown)}; known: {SWITCH_NAMES}")
    with _lock:
        saved = _switches
        _switches = replace(saved, **switches)
    try:
        yield _switches
    finally:
        with _lock:
            _switches = saved


def env(name: str, default: str = "auto") -> str:
    return os.environ.get(name, default)


def env_choice(name: str, modes) -> str:
    mode = os.environ.get(name, "auto")
    if mode not in modes:
        raise ValueError(f"{name} must be one of {modes}, got {mode!r}")
    return mode


def secure_v_pad_pairs() -> bool:
    mode = os.environ.get(SECURE_V_PAD_ENV, "pairs")
    if mode not in ("pairs", "zeros"):
        raise ValueError(f"{SECURE_V_PAD_ENV} must be 'pairs' or 'zeros', got {mode!r}")
    return mode == "pairs"


@dataclass(frozen=True)
class SecurePadding:
    """What the secure pre-passes put in the padding that the tensor cores multiply (timing gate,
    docs/security.md 5.4): ``k_scaled`` padding keys as public shrinks of key 0 instead of copies
    (non-causal Gluon form); ``w_pairs`` the key weights' padding as cancelling pairs instead of zeros;
    ``fill_q`` Q's padding rows replaced by data-like stand-ins (a pre-pass over Q); ``fill_k`` the same
    for K and V in the causal self-attention form (V's stand-ins replace the V pre-pass's pattern)."""
    k_scaled: bool = True
    w_pairs: bool = True
    fill_q: bool = False
    fill_k: bool = False


def secure_padding() -> SecurePadding:
    """``FLASHCORE_SECURE_PAD`` (an audit knob): a comma list of :class:`SecurePadding` fields to switch on,
    ``-name`` to switch one off (unset: the defaults)."""
    raw = os.environ.get(SECURE_PAD_ENV, "")
    known = [f.name for f in fields(SecurePadding)]
    values = {}
    for item in (n.strip() for n in raw.split(",")):
        if not item:
            continue
        name = item.lstrip("-")
        if name not in known:
            raise ValueError(f"{SECURE_PAD_ENV} takes a comma list of {known} (-name: off), got {item!r}")
        values[name] = not item.startswith("-")
    return SecurePadding(**values)


# CPython keeps os.environ's contents in a dict of encoded names (POSIX: bytes); reading it directly costs a
# twentieth of os.environ.get, and snapshot() runs on every call (measured: ~5 of a KV-cache call's host us).
# Where that dict is not there or not bytes-keyed (another platform or implementation), os.environ.get.
_ENV_DATA = getattr(os.environ, "_data", None)
# Triton's own switch too: a plan made under its CPU interpreter must not serve a call made after it is switched
# off (that call is refused: kernels on CPU tensors need the interpreter), nor the other way round.
_ENV_NAMES = ENV_VARS + ("TRITON_INTERPRET",)
_ENV_KEYS = tuple(os.fsencode(n) for n in _ENV_NAMES)
if not (isinstance(_ENV_DATA, dict) and os.name == "posix"):
    _ENV_DATA = None


def snapshot() -> tuple:
    """Every knob's current value: part of every plan key (environment values as bytes on POSIX, as str
    elsewhere: the same within one process, which is all a key needs), Triton's interpreter switch and its debug
    mode (a plan keeps its compiled kernels, so turning either on or off must reach a new plan: its kernels, the
    interpreter's refusals, and secure mode's warning)."""
    if _ENV_DATA is not None:
        get = _ENV_DATA.get
        return (*(get(k) for k in _ENV_KEYS), _switches, triton_debug())
    get = os.environ.get
    return (*(get(n) for n in _ENV_NAMES), _switches, triton_debug())
