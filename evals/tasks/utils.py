"""What the task YAMLs here call as `!function utils.<name>`.

The one module of the suite that passes on names it imports, because an outside tool's convention
requires it: lm-eval resolves `!function utils.<name>` to the file `utils.py` beside the YAML
(lm_eval.utils.import_function: the part before the last dot is a file name, loaded by path), so
a function a task YAML calls must be reachable from this file. The code lives in
evals/local_data.py and evals/task_functions.py; the suite's own modules import it from there.
"""

from evals.local_data import (  # noqa: F401
    load_humaneval,
    load_humaneval_plus,
    load_mbpp,
    load_mbpp_plus,
    load_medmcqa,
    load_medqa,
    load_mmlu,
    load_pubmedqa,
)
from evals.task_functions import (  # noqa: F401
    humaneval_process_results,
    humaneval_test_program,
    mbpp_doc_to_target,
    mbpp_doc_to_text,
    mbpp_fewshot_samples,
    mbpp_process_results,
    medmcqa_doc_to_text,
    medqa_doc_to_text,
    pubmedqa_doc_to_text,
)
