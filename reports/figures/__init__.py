"""The report's figures, PNG and PDF, byte-identical for the same results.

    style.py      sizes, colours, rc settings, the layout in inches, byte-identical saving
    main.py       the main figures (quality against data used, time, clusters, workers, steps)
    loss.py       held-out loss, overall and per category
    analysis.py   the analyses' heatmaps and category coverage

See docs/reports.md.
"""
