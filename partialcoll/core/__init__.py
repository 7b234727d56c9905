"""The executor's Python face: the only code that talks to the C core.

* :mod:`.schedule` -- :class:`Schedule`: build a graph of operations,
  commit it, post it (:mod:`.slots` names its buffers, :mod:`.ops` its
  reductions and datatypes, :mod:`.request` its requests);
* :mod:`.engine` -- the progress engine as a whole (clock, counters, the
  transport layer's switches); :mod:`.clock` -- each rank's clock offset
  to a communicator's reference rank, for times that cross ranks;
* :mod:`.libcomm` -- the library's duplicates of user communicators,
  their tag space (:mod:`.tags`) and control collectives (:mod:`.control`);
* :mod:`.arrays`, :mod:`.buffers`, :mod:`.devices`, :mod:`.kernels` --
  what callers pass as data: NumPy, buffer-protocol objects, DLPack
  tensors, device (GPU) arrays;
* :mod:`.errors` (the exception hierarchy), :mod:`.checks` (argument
  checks), :mod:`.env` (every environment variable).

Nothing here knows of collectives: they are built above, on the public
:class:`Schedule` API.
"""
