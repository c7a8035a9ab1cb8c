"""MkDocs hooks for the ivhl_jax site (configured in mkdocs.yml, `hooks:`).

The library docstrings use Sphinx roles (``:func:`trajectory` ``); in Markdown they would render as the
literal text ``:func:`` before the code span. Strip the role and keep the code span.

MathJax is served from the site itself (see the end of this file).
"""

import atexit
import importlib.util
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

_ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|obj|exc|py:\w+):(<code>)")


def on_page_content(html, page, config, files):
    return _ROLE.sub(r"\1", html)


# --- the notebook kernels talk over local sockets ---------------------------------------------------------------
# mkdocs-jupyter executes each notebook in a Jupyter kernel, over TCP by default: the kernel then warns on every
# start that its traffic is unencrypted. On POSIX the kernels of the build use IPC transport instead (Unix sockets
# in a private temporary folder), through a Jupyter config folder put first on JUPYTER_CONFIG_PATH; the nbconvert
# application mkdocs-jupyter builds reads it, and the user's own Jupyter configuration is read after it.


_KERNEL_CONFIG: list[str] = []  # the config folder of this process (``mkdocs serve`` calls on_config per build)


def on_config(config, **kwargs):
    if os.name != "posix" or _KERNEL_CONFIG:
        return config
    folder = tempfile.mkdtemp(prefix="ivhl-docs-jupyter-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    settings = {"KernelManager": {"transport": "ipc", "ip": os.path.join(folder, "kernel")}}
    Path(folder, "jupyter_nbconvert_config.json").write_text(json.dumps(settings), encoding="utf-8")
    os.environ["JUPYTER_CONFIG_PATH"] = os.pathsep.join(
        p for p in (folder, os.environ.get("JUPYTER_CONFIG_PATH", "")) if p
    )
    _KERNEL_CONFIG.append(folder)
    return config


# --- MathJax, served from the site itself --------------------------------------------------------------------
# The site must render its equations offline (no CDN) and the build must fetch nothing: MathJax 3 is an installed
# package of the docs extra (`django-static-mathjax`, MathJax 3.2.2's release files under mathjax/static/mathjax/;
# it has no dependencies and needs no Django to be read), copied into the built site under
# javascripts/vendor/mathjax/. mkdocs.yml's extra_javascript points there.

MATHJAX_PACKAGE = "mathjax"  # the import name of django-static-mathjax
# tex-svg.js needs no font files; input/tex/extensions are the packages it autoloads (\require, \boldsymbol, ...);
# ui/ and a11y/ are loaded by the right-click menu. The speech engine (sre/, 4 MB) is left out.
_MATHJAX_PARTS = ("tex-svg.js", "input/tex/extensions", "ui", "a11y")


def _mathjax_es5() -> Path:
    spec = importlib.util.find_spec(MATHJAX_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("MathJax is not installed: the docs extra installs it (pip install -e '.[docs]', "
                           "or make docs)")
    es5 = Path(next(iter(spec.submodule_search_locations))) / "static" / "mathjax" / "es5"
    if not (es5 / "tex-svg.js").is_file():
        raise RuntimeError(f"{es5} has no tex-svg.js: reinstall django-static-mathjax (the docs extra)")
    return es5


def on_post_build(config, **kwargs):
    dest = Path(config["site_dir"]) / "javascripts" / "vendor" / "mathjax"
    shutil.rmtree(dest, ignore_errors=True)
    es5 = _mathjax_es5()
    for part in _MATHJAX_PARTS:
        src = es5 / part
        if src.is_dir():
            shutil.copytree(src, dest / part)
        else:
            (dest / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / part)
