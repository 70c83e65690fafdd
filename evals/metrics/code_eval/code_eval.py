"""`code_eval` as an `evaluate` metric loaded from this directory, for machines without the hub.

    import evaluate
    code_eval = evaluate.load("evals/metrics/code_eval")   # a local path, no download
    pass_at_k, results = code_eval.compute(references=tests, predictions=candidates, k=[1, 10])

Same call signature and return value as the hub metric `code_eval` (references: one test program
per problem; predictions: a list of candidate programs per problem; k, num_workers, timeout), but
every program runs in the cluster-repro sandbox (evals/sandbox.py), so it needs no
HF_ALLOW_CODE_EVAL opt-in. The work is done by `evals.code_eval.compute_code_eval`.
"""

import datasets
import evaluate

from evals.code_eval import compute_code_eval

_DESCRIPTION = (
    "Runs each candidate program followed by its test program in a sandbox and "
    "returns the unbiased pass@k estimate."
)
_KWARGS = """
Args:
    predictions: list of candidates per problem, list[list[str]].
    references: one test program per problem, list[str].
    k: the k values of pass@k (default [1, 10, 100]; a k above a problem's candidate count is
       left out).
    num_workers: programs run at once (default 4).
    timeout: wall-clock seconds per program (default 3.0).
Returns:
    (pass_at_k, results): {"pass@k": float}, and per problem a list of
    (completion_id, {"task_id", "completion_id", "passed", "result"}).
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS)
class CodeEval(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            module_type="metric",
            description=_DESCRIPTION,
            citation="Chen et al. 2021, Evaluating Large Language Models Trained on Code",
            inputs_description=_KWARGS,
            features=datasets.Features(
                {
                    "predictions": datasets.Sequence(datasets.Value("string")),
                    "references": datasets.Value("string"),
                }
            ),
            homepage="https://github.com/openai/human-eval",
            license="MIT",
        )

    def _compute(self, predictions, references, k=(1, 10, 100), num_workers=4, timeout=3.0):
        return compute_code_eval(
            references=references, predictions=predictions, k=k, num_workers=num_workers, timeout=timeout
        )
