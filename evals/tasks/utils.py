"""What the task YAMLs here call as `!function utils.<name>`. lm-eval loads this file by path,
so it only re-exports; the code lives in evals/local_data.py and evals/task_functions.py."""

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
