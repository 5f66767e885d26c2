"""Run directories: one job a file, each importing only the files above it in this list.

- ``files``       — atomic writes with the umask's mode, bounded reads of JSON and JSON lines, file stamps
- ``metrics_log`` — ``metrics.jsonl``: rows checked line by line, and the metrics frame
- ``identity``    — which config fields define a run, fingerprints of model and data files, resume checks
- ``claim``       — the OS lock a training takes on its run dir, and whether a folder already holds a run
- ``checkpoints`` — checkpoints and recorded update states, written as safetensors + JSON and read back
- ``step``        — a recorded step: lazy tensors, checked JSON, and its update plan (``StepRecord.opt_step``)
- ``reader``      — :class:`~ppolab.run.reader.Run`: config, metrics, tokenizer and committed steps
- ``recorder``    — :class:`~ppolab.run.recorder.Recorder`: the only writer of a run dir

Only JSON and safetensors, never pickle.
"""
