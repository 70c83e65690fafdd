"""The paper's claims checked against the results store (`cluster-repro claims`).

    claims.yaml   the claims as data
    file.py       the claims file's keys, checked as it is loaded (`load_claims`)
    verdicts.py   one verdict per check and setting (`evaluate`, Holm's reading)
    time.py       training time taken apart, CluSTER against full data
    output.py     the verdicts laid out: the claims table, snippets, counts, JSON
    figure.py     every verdict's estimate and interval against its threshold
    cli.py        `cluster-repro claims`

See docs/claims.md.
"""
