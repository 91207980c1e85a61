"""pytest runs every ```python block of README.md and docs/*.md: see tests/docs_examples.py.

This file sits at the root because README.md does: a conftest's collector sees only files below it.
"""

from tests.docs_examples import docs_page, docs_s3_server, pytest_collect_file

__all__ = ["docs_page", "docs_s3_server", "pytest_collect_file"]
