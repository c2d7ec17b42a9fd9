"""Host side of each kernel family: from a call's public facts and a configuration to what a launch
needs (grid, positional arguments, constexprs, compile options). One module per device module in
``flashcore.kernels``; the planner (``flashcore.plan``) and the static audit (``flashcore.audit.specs``)
both build their launches here, so the audit compiles exactly what runs."""
