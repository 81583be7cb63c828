"""Resolving transformers' names before stages run in threads.

transformers 5 resolves ``from transformers import X`` lazily, the first time a name is asked for,
and that first resolution is not thread-safe: two threads resolving names at the same time can get
``ImportError: cannot import name 'AutoTokenizer' from 'transformers'`` though the name exists.
An experiment that builds its arms at once (``arm_concurrency``) runs stages in threads, and on an
H200 one arm failed so, once in its vocabulary stage and once in its pretraining; 12 threads
importing 6 names reproduce it on CPU in most runs. Once a name is resolved, later imports of it
only read an attribute, so resolving every name the stages import, in one thread, before the
threads start, is enough (tests/test_imports.py checks that the list holds every name
``orchestrator`` imports, and that threads importing them after this do not fail).
"""
from __future__ import annotations

#: Every name ``orchestrator`` imports from transformers (tests/test_imports.py keeps it complete).
TRANSFORMERS_NAMES = (
    "AutoConfig", "AutoModel", "AutoModelForPreTraining", "AutoModelForTokenClassification", "AutoTokenizer",
    "BertConfig", "BertForMaskedLM", "BertForPreTraining", "BertJapaneseTokenizer", "BertTokenizer",
    "PreTrainedModel", "get_linear_schedule_with_warmup",
)


def resolve_transformers_names() -> None:
    """Import transformers and resolve each of ``TRANSFORMERS_NAMES`` in the calling thread; call it
    before starting threads that run stages. A name transformers no longer has raises ImportError
    here, as the stage importing it would."""
    import transformers  # heavy: transformers (the point of this function)

    for name in TRANSFORMERS_NAMES:
        if not hasattr(transformers, name):
            raise ImportError(f"cannot import name {name!r} from 'transformers' ({transformers.__version__})")
