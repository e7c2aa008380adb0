"""What a user calls from Python to train, test and inspect a detector.

The rule: a module belongs here when a user (or a ``tools/*.py`` script,
which only parses its options and calls it) runs a model with it: training,
testing, robustness evaluation and the pictures and records of what the
model did. Benchmarks and checks go to ``diagnostics/``, the demo and the
study drivers to ``experiments/``; command-line parsing stays in ``tools/``.

* train and test, side by side: ``train`` (``train_detector``,
  tools/train.py) and ``test`` (config, corruption, model, loader, nuScenes
  metrics; tools/test.py);
* robustness evaluation: ``robustness_eval`` (tools/eval_robustness.py) with
  ``object_metrics``, ``sample_recorder``, ``attention_mass`` and
  ``sample_subset``;
* routing pictures: ``routing_pictures`` and ``decoder_capture``
  (tools/visualize_aqr.py);
* heading and velocity errors per class: ``box_errors`` (tools/analyze_box_errors.py).

Imports ``mmcv_custom``, ``models``, ``datasets``, ``core``, ``attention`` and
``utils``, never ``diagnostics`` or ``experiments``. Not imported by the
plugin's ``__init__``: importing a module here registers the plugin as any
plugin import does.
"""
