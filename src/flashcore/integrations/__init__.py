"""Integrations with other libraries' attention interfaces: ``transformers`` (Hugging Face transformers >= 5;
the ``flashcore[transformers]`` extra), imported on demand."""
