"""EvalPlus's protocol (evalplus==0.3.1) for HumanEval+ and MBPP+, in the suite's sandbox.

    data.py       the release files: where they live, loading and checking them
    compare.py    EvalPlus's comparison rules (standard library only: run inside the sandbox)
    check.py      the differential test of one solution, in the sandbox, in two runs
    protocol.py   the evalplus protocol: sanitize, check, score

See docs/benchmarks.md.
"""
