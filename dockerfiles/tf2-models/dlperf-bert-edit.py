"""DLPerf's edit of the Model Garden's official/nlp/bert/run_pretraining.py (Oneflow-Inc/DLPerf TensorFlow/bert/
README.md, "LINE 186"): XLA from --enable_xla, the cluster from --worker_hosts/--task_index (TF_CONFIG) and
--all_reduce_alg given to the distribution strategy. The r2.3.0 file defines those flags and ignores them; without
the edit a multi-node run trains each node on its own. The build stops when the text DLPerf replaced is not there
exactly once."""

import importlib.util
import sys

OLD = """  strategy = distribution_utils.get_distribution_strategy(
      distribution_strategy=FLAGS.distribution_strategy,
      num_gpus=FLAGS.num_gpus,
      tpu_address=FLAGS.tpu)
"""
NEW = """  from official.utils.misc import keras_utils
  keras_utils.set_session_config(enable_xla=FLAGS.enable_xla)

  distribution_utils.configure_cluster(
      FLAGS.worker_hosts,
      FLAGS.task_index)

  strategy = distribution_utils.get_distribution_strategy(
      distribution_strategy=FLAGS.distribution_strategy,
      all_reduce_alg=FLAGS.all_reduce_alg,
      num_gpus=FLAGS.num_gpus,
      tpu_address=FLAGS.tpu)
"""

spec = importlib.util.find_spec("official.nlp.bert.run_pretraining")
if spec is None or not spec.origin:
    sys.exit("dlperf-bert-edit: official.nlp.bert.run_pretraining is not installed (tf-models-official)")
with open(spec.origin, encoding="utf-8") as f:
    text = f.read()
if text.count(OLD) != 1:
    sys.exit(f"dlperf-bert-edit: {spec.origin} holds the text DLPerf replaced {text.count(OLD)} times, not once")
with open(spec.origin, "w", encoding="utf-8") as f:
    f.write(text.replace(OLD, NEW))
print(f"dlperf-bert-edit: {spec.origin} edited as DLPerf's TensorFlow/bert/README.md says")
