"""Collectives built as schedules on the executor (libNBC's layout: the
engine knows no collective; each algorithm is a builder).

* :mod:`.allreduce` -- ``allreduce``/``iallreduce``: check the buffers
  (:mod:`.arguments`), pick the algorithm (:mod:`.algorithm`), take a
  committed schedule from the pool (:mod:`.pool`), post it;
* :mod:`.builders` -- one builder per algorithm, each given a
  :class:`~.context.BuildContext`;
* :mod:`.staging` -- tensors, 16-bit floats and wire compression;
* :mod:`.partial` -- the partial collectives (solo, majority, quorum);
* :mod:`.broadcast` -- broadcasts of picklable objects and the agreement
  checks the torch broadcasts build on.
"""
