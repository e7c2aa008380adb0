"""Command-line options that several ``tools/*.py`` share (argparse helpers).

What belongs here: a function that adds options to a tool's
``argparse.ArgumentParser``, an ``argparse`` type that checks one option, and
the step that applies a parsed option before a tool runs. Nothing under
``projects/`` imports argparse: the library takes plain values, the tools
parse the command line with these helpers and pass the values on.

* :mod:`.launch`: ``--seed``, ``--deterministic``, ``--cfg-options``,
  ``--launcher``, ``--local_rank`` (tools/train.py, tools/test.py,
  tools/init_checkpoint.py);
* :mod:`.corruption`: ``--corruption`` / ``--corruption-seed`` and the
  checked corruption specs (tools/test.py, tools/visualize_aqr.py,
  tools/eval_robustness.py);
* :mod:`.train_corruptions`: ``--train-corruptions`` (tools/train.py);
* :mod:`.tiled_bias_launch`: ``--tiled-bias-launch`` (tools/benchmark_attention.py,
  tools/benchmark_model.py);
* :mod:`.attention_dtype`: ``--attention-dtype`` (tools/benchmark_model.py, tools/check_gpu.py).

``tools/`` is no package; like ``tools.data_converter``, ``tools.cli``
imports from the repository root, which the editable install puts on ``sys.path``.
"""
