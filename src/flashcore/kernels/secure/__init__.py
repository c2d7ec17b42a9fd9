"""Secure-mode (constant-time) pre-passes: they take the secret lengths so the main kernels need not."""
