"""What the tools share: testing a checkpoint (tools/test.py, tools/eval_robustness.py, tools/visualize_aqr.py),
benchmarking a model, and the robustness study (tools/robustness_study.py: ``study_arms``, ``study_metrics``,
``sample_recorder``, ``study_report``, ``robustness_study``).

Not imported by the plugin's ``__init__``: the tools import these modules
themselves, and importing them registers the plugin as any plugin import does.
"""
