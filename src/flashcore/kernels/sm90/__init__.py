"""Hopper (sm_90a) Gluon kernels, with their shared device parts as modules of their own:
``tile_scheduler`` (which work item a program takes), ``pipeline`` (the TMA loader and its rings),
``softmax`` (online softmax of a score tile), ``mma_layouts`` (wgmma accumulator layouts) and ``trace`` (the
debug timeline)."""
