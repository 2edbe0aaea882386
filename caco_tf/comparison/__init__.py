"""Which method for my images? ``caco-compare``: the methods compared on the user's own data.

A comparison is a folder (``Comparison``): its plan, fixed before any run (``plan.json``: the
methods, each method's trials drawn from its search space, the seeds, the shared budget), its
splits (``splits/``: validation carved from the training images, the test split, the few
labels), one run folder per training (``runs/tune/<method>/trial<i>``,
``runs/final/<method>/seed<s>``) and what was measured (``state.json``, written after every
measurement).  Re-running the same command continues where it stopped: a training resumes from
its checkpoint, a finished measurement is never taken again.

- ``trials``: the search spaces (each method's ``Setting(search=...)`` and the encoder's
  learning rate) and the trials drawn from them, the same number for every method;
- ``splits``: the seeded, stratified, disjoint splits and the few-label subsets;
- ``runner``: the plan, the runs and their measurements, the time estimate;
- ``report``: ``report.md``, ``report.html`` and the plots, read back from the run folders.
"""
