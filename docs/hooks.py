"""MkDocs hooks for the ivhl_jax site (configured in mkdocs.yml, `hooks:`).

The library docstrings use Sphinx roles (``:func:`trajectory` ``); in Markdown they would render as the
literal text ``:func:`` before the code span. Strip the role and keep the code span.
"""

import re

_ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|obj|exc|py:\w+):(<code>)")


def on_page_content(html, page, config, files):
    return _ROLE.sub(r"\1", html)
