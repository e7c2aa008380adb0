"""What the tools do (mmdet3d's convention: ``tools/`` parse their arguments, call a function here and print).

* testing a checkpoint: ``testing`` (tools/test.py), ``robustness_eval``
  (tools/eval_robustness.py), ``routing_pictures`` and ``decoder_capture``
  (tools/visualize_aqr.py), ``sample_subset``;
* benchmarks and checks: ``attention_cases``, ``attention_benchmark``,
  ``attention_benchmark_tables`` (tools/benchmark_attention.py),
  ``model_benchmark``, ``model_benchmark_tables``, ``part_timer``,
  ``optimizer_step``, ``synthetic_batch`` (tools/benchmark_model.py),
  ``gpu_check``, ``training_check`` (tools/check_gpu.py), ``train_step_profile``
  (tools/profile_train_step.py), ``spconv_race_check``
  (tools/check_spconv_race.py), ``process_memory`` (peak memory in a fresh
  process);
* the demo and the robustness study: ``demo_pipeline`` (tools/demo.py),
  ``study_arms``, ``study_metrics``, ``sample_recorder``, ``study_report``,
  ``robustness_study`` (tools/robustness_study.py);
* ``repo_paths``, ``local_resources``: the checkout's root, the machine's cores and a free port.

Not imported by the plugin's ``__init__``: the tools import these modules
themselves, and importing them registers the plugin as any plugin import does.
"""
