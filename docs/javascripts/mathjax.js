// MathJax 3 for the guides (pymdownx.arithmatex, generic mode) and the notebooks ($...$ and $$...$$ in
// markdown cells). Code blocks are never typeset (MathJax skips pre/code by default).
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"], ["$", "$"]],
    displayMath: [["\\[", "\\]"], ["$$", "$$"]],
    processEscapes: true,
    processEnvironments: true
  }
};
document$.subscribe(() => { if (window.MathJax && MathJax.typesetPromise) { MathJax.typesetPromise(); } });
