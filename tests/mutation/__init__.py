"""Mutation testing of flashcore's test suite: ``python -m tests.mutation.run --help`` (see run.py and
docs/mutation.md)."""
