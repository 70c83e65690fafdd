"""reports/: every table and figure rebuilt from the results store alone (`cluster-repro report`).

Read in this order: `runs` (the Run record, benchmark names and domains), `load` (result rows ->
runs -> cells), `stats` (Student-t intervals over seeds), `names`
(display names), `values` (Column, Table and the values a table shows), `tables` (the tables as
data), `reported` (the paper's numbers beside ours),
`compact` (the paper-shaped main tables), `render` (Markdown, LaTeX, CSV), `figures/` (PNG, PDF),
`build` (assembles the tables, writes everything and the index page), `cli`. Each module imports
only those before it. `claims/` (the paper's claims checked, `cluster-repro claims`) sits beside
them: build draws its figure, and its cli writes through build's staging folder.
See docs/reports.md.
"""
