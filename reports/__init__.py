"""reports/: every table and figure rebuilt from the results store alone (`cluster-repro report`).

Read in this order: `load` (result rows -> runs -> cells), `stats` (bootstrap intervals), `tables`
(the tables as data), `reported` (the paper's numbers beside ours), `render` (Markdown, LaTeX,
CSV), `figures` (PNG, PDF), `build` (writes everything and the index page), `cli`.
See docs/reports.md.
"""
