"""The documentation site: `mkdocs build --strict` succeeds and the pages users land on hold what they should.

Slow (the build executes the four notebooks). Skipped when the docs extra (mkdocs-material,
mkdocstrings-python, mkdocs-jupyter) is not installed; the browser test is skipped without chromium.
The browser test drives headless Chromium over the DevTools protocol (--remote-debugging-pipe, stdlib only):
each page must load with no console error, no failed request and no request outside the site (MathJax is
served by the site, see docs/hooks.py), every <img> decoded, and its equations typeset. DOCS_SCREENSHOTS=<dir>
keeps the screenshots.
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

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

# page (relative to the site root) -> texts it must contain (after HTML unescaping)
PAGES = {
    "index.html": ["ivhl_jax", "make demo", "make test", "ivhl.trajectory(st, chain, 100, save_every=10"],
    "guide/condensates/index.html": ["Strang split-step Fourier", "Thomas–Fermi", "project_norm=True"],
    "api/physics.condensate/index.html": [
        "i ∂ψ/∂t = [−½∇² + V(r) + g|ψ|² − Ω L_z] ψ",  # the equation in the module docstring
        "ground_state",
        "GPSystem",
        "strang",
    ],
    "notebooks/02_condensates/index.html": ["Gross–Pitaevskii", "vortex"],
}


BUILD_LOG: list[str] = []  # the build's stderr (the site fixture's one build)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    for mod in ("mkdocs", "material", "mkdocstrings_handlers.python", "mkdocs_jupyter"):
        pytest.importorskip(mod, reason="docs extra not installed: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", MPLBACKEND="Agg")
    # Notebooks run on one device, as a reader's machine would; don't inherit the suite's 8 emulated devices.
    env.pop("XLA_FLAGS", None)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    problems = [ln for ln in proc.stderr.splitlines() if ln.startswith(("WARNING", "ERROR"))]
    detail = "\n".join(problems or proc.stderr.splitlines()[-40:])
    assert proc.returncode == 0, "mkdocs build --strict failed:\n" + detail
    BUILD_LOG.append(proc.stderr)
    print(f"\nmkdocs build --strict: {time.perf_counter() - t0:.0f} s into {out}")
    return out


def _text(path: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text(encoding="utf-8")))


def _img_sources(page: Path) -> list[str]:
    return [html.unescape(m) for m in re.findall(r"<img\b[^>]*?\bsrc=[\"']([^\"']*)[\"']", page.read_text("utf-8"))]


def test_the_build_says_nothing_a_reader_must_ignore(site):
    """``make docs`` builds as the fixture does (the Material end-of-life banner switched off by its documented
    variable) and the notebook kernels talk over IPC (docs/hooks.py): no kernel warns that its traffic is
    unencrypted, and no line of the build is a warning."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^DOCS_ENV = .*NO_MKDOCS_2_WARNING=1", makefile, re.M), "make docs would print the banner"
    assert re.search(r"^\t\$\(DOCS_ENV\) \$\(BIN\)/mkdocs build --strict", makefile, re.M)
    noisy = [ln for ln in BUILD_LOG[0].splitlines() if "unencrypted" in ln or ln.lstrip().startswith("WARNING")]
    assert not noisy, "\n".join(noisy)


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


# Pages with equations: MathJax must have typeset them (no raw TeX left for the reader).
MATH_PAGES = {"notebooks/02_condensates/index.html"}
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--hide-scrollbars",
    "--mute-audio",
    "--remote-debugging-pipe",
]


class _Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe (fds 3/4, NUL-separated JSON): stdlib only."""

    def __init__(self, exe: str, profile: Path):
        import threading

        cmd_r, self._cmd_w = os.pipe()  # we write commands -> chromium reads fd 3
        self._evt_r, evt_w = os.pipe()  # chromium writes fd 4 -> we read

        def child_fds():  # runs in the child between fork and exec
            a, b = os.dup(cmd_r), os.dup(evt_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
            preexec_fn=child_fds,
            close_fds=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        os.close(cmd_r)
        os.close(evt_w)
        self._next_id = 0
        self._replies: dict[int, dict] = {}
        self.events: list[dict] = []
        self._cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        import json

        buf = b""
        while chunk := os.read(self._evt_r, 1 << 16):
            buf += chunk
            *msgs, buf = buf.split(b"\0")
            with self._cv:
                for raw in msgs:
                    msg = json.loads(raw)
                    if "id" in msg:
                        self._replies[msg["id"]] = msg
                    else:
                        self.events.append(msg)
                self._cv.notify_all()

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60):
        import json

        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        with self._cv:
            if not self._cv.wait_for(lambda: self._next_id in self._replies or self.proc.poll() is not None, timeout):
                raise TimeoutError(f"chromium: no reply to {method} in {timeout} s")
            reply = self._replies.pop(self._next_id, None)
        if reply is None:
            raise RuntimeError(f"chromium exited ({self.proc.returncode}): {self.proc.stderr.read()[-2000:]!r}")
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    def wait_event(self, method: str, session: str, timeout: float = 60) -> dict:
        with self._cv:
            ok = self._cv.wait_for(
                lambda: any(e["method"] == method and e.get("sessionId") == session for e in self.events), timeout
            )
        assert ok, f"chromium: no {method} in {timeout} s"
        return next(e for e in self.events if e["method"] == method and e.get("sessionId") == session)

    def evaluate(self, expr: str, session: str):
        res = self.send("Runtime.evaluate", {"expression": expr, "awaitPromise": True, "returnByValue": True}, session)
        assert "exceptionDetails" not in res, f"{expr[:80]}: {res['exceptionDetails']}"
        return res["result"].get("value")

    def close(self):
        try:
            self.send("Browser.close", timeout=10)
            self.proc.wait(timeout=10)
        except Exception:
            self.proc.kill()
            self.proc.wait(timeout=10)
        os.close(self._cmd_w)


def _problems(events: list[dict], base: str) -> list[str]:
    """Console errors, uncaught exceptions, failed requests and requests leaving the site, from CDP events."""
    out = []
    for e in events:
        m, p = e["method"], e.get("params", {})
        if m == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert"):
            out.append(
                "console."
                + p["type"]
                + ": "
                + " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"])
            )
        elif m == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            out.append(f"uncaught exception: {d.get('exception', {}).get('description') or d.get('text')}")
        elif m == "Log.entryAdded" and p["entry"]["level"] == "error":
            out.append(f"console ({p['entry']['source']}): {p['entry']['text']} {p['entry'].get('url', '')}")
        elif m == "Network.loadingFailed":
            out.append(f"request failed: {p['errorText']} ({p.get('type')})")
        elif m == "Network.requestWillBeSent":
            url = p["request"]["url"]
            if not url.startswith((base, "data:", "blob:", "about:")):
                out.append(f"request outside the site: {url}")
    return out


@pytest.fixture(scope="module")
def served_site(site):
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(site)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(base, timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield base
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture(scope="module")
def screenshot_dir(tmp_path_factory) -> Path:
    """DOCS_SCREENSHOTS=<dir> keeps the screenshots there; otherwise a pytest temporary folder."""
    out = (
        Path(os.environ["DOCS_SCREENSHOTS"])
        if os.environ.get("DOCS_SCREENSHOTS")
        else (tmp_path_factory.mktemp("screenshots"))
    )
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.mark.skipif(_chromium() is None, reason="chromium not installed (apt-get install chromium)")
@pytest.mark.parametrize("rel", list(PAGES))
def test_page_in_headless_chromium(served_site, screenshot_dir, tmp_path, rel):
    """Load the page in a real browser: no console errors, no failed or outside requests, every <img> decoded,
    the equations typeset by the site's own MathJax; save a screenshot."""
    import base64

    url = urljoin(served_site, rel.removesuffix("index.html"))
    browser = _Browser(_chromium(), tmp_path / "chromium-profile")
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            browser.send(f"{domain}.enable", session=session)
        browser.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False},
            session,
        )
        nav = browser.send("Page.navigate", {"url": url}, session)
        assert "errorText" not in nav, f"{url}: {nav['errorText']}"
        browser.wait_event("Page.loadEventFired", session)
        # MathJax typesets after load; wait for it, then for the page to settle.
        mathjax = browser.evaluate(
            "(async () => { if (!window.MathJax || !MathJax.startup) return null;"
            " await MathJax.startup.promise; await MathJax.typesetPromise(); return MathJax.version; })()",
            session,
        )
        time.sleep(0.5)
        assert mathjax, f"{rel}: MathJax did not load from the site"
        broken = browser.evaluate(
            "Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0))"
            ".map(i => i.src.slice(0, 120))",
            session,
        )
        assert not broken, f"{rel}: images that did not load: {broken}"
        math = browser.evaluate(
            "({typeset: document.querySelectorAll('mjx-container').length,"
            "  errors: document.querySelectorAll('mjx-merror').length,"
            "  raw: document.querySelectorAll('.arithmatex').length"
            "       - document.querySelectorAll('.arithmatex mjx-container').length})",
            session,
        )
        assert math["errors"] == 0, f"{rel}: MathJax reported {math['errors']} TeX errors"
        assert math["raw"] <= 0, f"{rel}: {math['raw']} arithmatex spans were left as raw TeX"
        if rel in MATH_PAGES:
            assert math["typeset"] > 0, f"{rel}: no typeset equations"
            browser.evaluate("document.querySelector('mjx-container').scrollIntoView({block: 'center'})", session)
            time.sleep(0.3)
        png = screenshot_dir / (rel.removesuffix("/index.html").removesuffix(".html").replace("/", "_") + ".png")
        png.write_bytes(base64.b64decode(browser.send("Page.captureScreenshot", {"format": "png"}, session)["data"]))
        assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        problems = _problems(browser.events, served_site)
        assert not problems, f"{rel}: " + "\n".join(problems)
        print(f"\n{rel}: MathJax {mathjax}, {math['typeset']} equations, screenshot {png}")
    finally:
        browser.close()
