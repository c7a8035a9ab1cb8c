"""MkDocs hooks for the ivhl_jax site (configured in mkdocs.yml, `hooks:`).

The library docstrings use Sphinx roles (``:func:`trajectory` ``); in Markdown they would render as the
literal text ``:func:`` before the code span. Strip the role and keep the code span.

MathJax is served from the site itself (see the end of this file).
"""

import base64
import hashlib
import io
import logging
import re
import shutil
import subprocess
import tarfile
import urllib.request
from pathlib import Path

_ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|obj|exc|py:\w+):(<code>)")


def on_page_content(html, page, config, files):
    return _ROLE.sub(r"\1", html)


# --- MathJax, served from the site itself --------------------------------------------------------------------
# The site must render its equations offline (no CDN): MathJax 3 comes from the npm registry at build time
# (`npm pack`, or a plain HTTPS download of the same tarball when npm is absent), is checked against the
# registry's sha512, cached in .cache/ (gitignored) and copied into the built site under
# javascripts/vendor/mathjax/. mkdocs.yml's extra_javascript points there.

MATHJAX_VERSION = "3.2.2"
MATHJAX_SHA512 = "Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw=="
MATHJAX_TARBALL = f"https://registry.npmjs.org/mathjax/-/mathjax-{MATHJAX_VERSION}.tgz"
# tex-svg.js needs no font files; input/tex/extensions are the packages it autoloads (\require, \boldsymbol, ...);
# ui/ and a11y/ are loaded by the right-click menu. The speech engine (sre/, 4 MB) is left out.
_MATHJAX_PARTS = ("es5/tex-svg.js", "es5/input/tex/extensions", "es5/ui", "es5/a11y")
_ROOT = Path(__file__).resolve().parents[1]
_log = logging.getLogger("mkdocs.hooks.mathjax")


def _mathjax_tarball(cache: Path) -> bytes:
    tgz = cache / f"mathjax-{MATHJAX_VERSION}.tgz"
    if not tgz.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        _log.info("fetching MathJax %s from the npm registry into %s", MATHJAX_VERSION, cache)
        npm = shutil.which("npm")
        if npm:
            subprocess.run([npm, "pack", f"mathjax@{MATHJAX_VERSION}", "--silent", "--pack-destination", str(cache)],
                           check=True, capture_output=True, timeout=300)
        else:
            with urllib.request.urlopen(MATHJAX_TARBALL, timeout=120) as r:
                tgz.write_bytes(r.read())
    data = tgz.read_bytes()
    digest = base64.b64encode(hashlib.sha512(data).digest()).decode()
    if digest != MATHJAX_SHA512:
        tgz.unlink()
        raise RuntimeError(f"MathJax tarball {tgz} does not match the registry's sha512; removed it, build again")
    return data


def on_post_build(config, **kwargs):
    dest = Path(config["site_dir"]) / "javascripts" / "vendor" / "mathjax"
    shutil.rmtree(dest, ignore_errors=True)
    data = _mathjax_tarball(_ROOT / ".cache" / "mathjax")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            rel = member.name.removeprefix("package/")
            if not member.isfile() or not any(rel == p or rel.startswith(p + "/") for p in _MATHJAX_PARTS):
                continue
            target = dest / rel.removeprefix("es5/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(tar.extractfile(member).read())
