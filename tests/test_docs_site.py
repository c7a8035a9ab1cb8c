"""The documentation site: `mkdocs build --strict` succeeds and the pages users land on hold what they should.

Slow (the build executes the four notebooks). Skipped when the docs extra (mkdocs-material,
mkdocstrings-python, mkdocs-jupyter) is not installed; the browser test is skipped without chromium.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow

# page (relative to the site root) -> texts it must contain (after HTML unescaping)
PAGES = {
    "index.html": ["ivhl_jax", "make demo", "make test", "ivhl.trajectory(st, chain, 100, save_every=10"],
    "guide/condensates/index.html": ["Strang split-step Fourier", "Thomas–Fermi", "project_norm=True"],
    "api/physics.condensate/index.html": [
        "i ∂ψ/∂t = [−½∇² + V(r) + g|ψ|² − Ω L_z] ψ",  # the equation in the module docstring
        "ground_state", "GPSystem", "strang",
    ],
    "notebooks/02_condensates/index.html": ["Gross–Pitaevskii", "vortex"],
}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    for mod in ("mkdocs", "material", "mkdocstrings_handlers.python", "mkdocs_jupyter"):
        pytest.importorskip(mod, reason="docs extra not installed: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", MPLBACKEND="Agg")
    # Notebooks run on one device, as a reader's machine would; don't inherit the suite's 8 emulated devices.
    env.pop("XLA_FLAGS", None)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    problems = [ln for ln in proc.stderr.splitlines() if ln.startswith(("WARNING", "ERROR"))]
    detail = "\n".join(problems or proc.stderr.splitlines()[-40:])
    assert proc.returncode == 0, "mkdocs build --strict failed:\n" + detail
    print(f"\nmkdocs build --strict: {time.perf_counter() - t0:.0f} s into {out}")
    return out


def _text(path: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text(encoding="utf-8")))


def _img_sources(page: Path) -> list[str]:
    return [html.unescape(m) for m in re.findall(r"<img\b[^>]*?\bsrc=[\"']([^\"']*)[\"']", page.read_text("utf-8"))]


@pytest.mark.parametrize("rel", list(PAGES))
def test_page_exists_with_expected_text(site, rel):
    page = site / rel
    assert page.is_file(), f"{rel} missing from the built site"
    text = _text(page)
    for needle in PAGES[rel]:
        assert needle in text, f"{rel}: expected text {needle!r} not found"


@pytest.mark.parametrize("rel", list(PAGES))
def test_every_image_resolves(site, rel):
    page = site / rel
    for src in _img_sources(page):
        if src.startswith("data:"):
            assert re.match(r"data:image/[\w+.-]+(;base64)?,.+", src, re.S), f"{rel}: malformed data URI image"
            continue
        parsed = urlparse(src)
        assert not parsed.scheme and not parsed.netloc, f"{rel}: image from outside the site: {src}"
        target = (page.parent / unquote(parsed.path)).resolve()
        if target.is_dir():
            target = target / "index.html"
        assert target.is_file(), f"{rel}: <img src={src!r}> does not resolve to a file"


def test_notebook_page_holds_executed_plots(site):
    imgs = _img_sources(site / "notebooks/02_condensates/index.html")
    assert sum(s.startswith("data:image/png") for s in imgs) >= 3, "executed notebook should embed its figures"


def test_api_pages_cover_every_module(site):
    import ivhl_jax

    layers = ("core", "numerics", "physics", "nn", "train", "run")
    for layer in layers:
        for f in sorted((Path(ivhl_jax.__file__).parent / layer).glob("*.py")):
            if f.name.startswith("_"):
                continue
            page = site / "api" / f"{layer}.{f.stem}" / "index.html"
            assert page.is_file(), f"no API page for ivhl_jax.{layer}.{f.stem} (add docs/api/{layer}.{f.stem}.md + nav)"
            text = _text(page)
            assert ":func:" not in text and ":class:" not in text, f"{page}: unconverted Sphinx role"


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(_chromium() is None, reason="chromium not installed (apt-get install chromium)")
def test_screenshots_in_headless_chromium(site, tmp_path_factory):
    shots = tmp_path_factory.mktemp("screenshots")
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                               "--directory", str(site)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}/"
        for _ in range(100):
            try:
                urllib.request.urlopen(base, timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        for rel in PAGES:
            url = urljoin(base, rel.removesuffix("index.html"))
            png = shots / (rel.removesuffix("/index.html").removesuffix(".html").replace("/", "_") + ".png")
            profile = tmp_path_factory.mktemp("chromium-profile")
            proc = subprocess.run(
                [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                 f"--user-data-dir={profile}", f"--screenshot={png}", "--window-size=1280,900", url],
                capture_output=True, text=True, timeout=120)
            assert png.is_file() and png.stat().st_size > 10_000, (
                f"no screenshot of {url} (rc {proc.returncode}): {proc.stderr[-2000:]}")
            with open(png, "rb") as fh:
                assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
        print(f"\nscreenshots in {shots}")
    finally:
        server.terminate()
        server.wait(timeout=10)
