"""Integrations with other libraries' attention interfaces (empty until the serving issue adds transformers)."""
