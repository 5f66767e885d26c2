"""What trains short runs for a lab — the one layer above the trainer that the labs call.

The numbers layer (:mod:`ppolab.numbers`) only reads runs; what needs *new* runs lives here, above
:func:`ppolab.train`, so the import graph's floors follow the data flow (trainer → runs → numbers → experiments):

* :mod:`~ppolab.experiments.ablations` — lab 15's "predict the curve": short runs that differ from a base run in
  one knob each, shipped for ``grpo_tiny`` and trained once into a cache for the learner's own run;
* :mod:`~ppolab.experiments.capstone_grade` — lab 17 part II: the learner's losses graded on hidden cases, on a
  replayed optimizer step and by a short run trained with them;
* :mod:`~ppolab.experiments.grader_guard` — that grader's isolation from the code it grades.
"""
